import { describe, expect, it } from 'vitest';

import {
  formatEstimate,
  formatWait,
  ListingEntry,
  QueueStatus,
  QueueStore,
  statusLabel
} from '../state';

/** A status event as the server emits it (kernel_queue/events.py). */
function event(kernelId: string, state: QueueStatus['state'], extra: Partial<QueueStatus> = {}) {
  const waiting = state === 'queued' || state === 'requeued';
  return {
    kernel_id: kernelId,
    state,
    backend: 'local',
    queue: 'gpu',
    position: waiting ? 1 : null,
    queue_length: waiting ? 1 : null,
    gpus: 1,
    devices: [],
    preemptions: 0,
    message: `${state}`,
    ...extra
  } as QueueStatus;
}

/** A store with a clock the test moves, already loaded with an empty listing. */
function loaded(longWaitMs = 10_000) {
  const clock = { now: 1_000_000 };
  const store = new QueueStore({ longWaitMs, now: () => clock.now });
  store.load([]);
  return { store, clock };
}

describe('statusLabel', () => {
  it.each([
    [event('k', 'queued', { position: 2 }), 'Queued · #2 in gpu'],
    [event('k', 'queued', { position: null }), 'Queued · in gpu'],
    [
      event('k', 'queued', { position: 3, estimated_wait_seconds: 240 }),
      'Queued · #3 in gpu · ~4 min'
    ],
    [event('k', 'queued', { estimated_wait_seconds: null }), 'Queued · #1 in gpu'],
    [event('k', 'requeued', { position: 1, estimated_wait_seconds: 40 }), 'Requeued · #1 · ~40 s'],
    [event('k', 'admitted'), 'Admitted · 1 GPU'],
    [event('k', 'admitted', { gpus: 2 }), 'Admitted · 2 GPUs'],
    [event('k', 'admitted', { gpus: 0 }), 'Admitted'],
    [event('k', 'running'), 'Running'],
    [event('k', 'resumed'), 'Running'],
    [
      event('k', 'preempted', {
        saving: true,
        message: "preempted: evicted by kernel 1234; saving its variables, then waiting in 'gpu' again"
      }),
      'Preempted · saving…'
    ],
    [
      event('k', 'preempted', { message: "preempted; the kernel will wait in 'gpu' again" }),
      'Preempted'
    ],
    [event('k', 'requeued', { position: 1 }), 'Requeued · #1'],
    [event('k', 'requeued', { position: null }), 'Requeued'],
    [event('k', 'failed'), 'Failed'],
    [
      event('k', 'parked', {
        saving: true,
        message: 'parking after 30 min idle: saving its variables, then giving back its GPU'
      }),
      'Parking · saving…'
    ],
    [
      event('k', 'parked', {
        message: 'parked after 30 min idle; GPU released; your next cell brings it back'
      }),
      'Parked · GPU released'
    ],
    [
      event('k', 'parked', { gpus: 2, message: 'parked on request; 2 GPUs released' }),
      'Parked · GPUs released'
    ],
    [
      event('k', 'parked', { gpus: 0, message: 'parked on request; queue place released' }),
      'Parked'
    ],
    [
      event('k', 'requeued', {
        position: 2,
        waking: true,
        message: "waking from parked: queued in 'gpu', position 2 of 2, needs 1 GPU"
      }),
      'Waking · #2'
    ]
  ])('%j reads %s', (status, label) => {
    expect(statusLabel(status)).toBe(label);
  });
});

describe('formatEstimate', () => {
  it.each([
    [40, '~40 s'],
    [240, '~4 min'],
    [7200, '~2 h'],
    [86_400, '> 1 day']
  ])('%d s reads %s', (seconds, text) => {
    expect(formatEstimate(seconds)).toBe(text);
  });
});

describe('formatWait', () => {
  it.each([
    [0, '0 s'],
    [59_999, '59 s'],
    [65_000, '1 min 05 s'],
    [3_600_000 + 7 * 60_000, '1 h 07 min']
  ])('%d ms reads %s', (ms, text) => {
    expect(formatWait(ms)).toBe(text);
  });
});

describe('QueueStore', () => {
  it('follows one kernel from queued to running', () => {
    const { store } = loaded();
    store.apply(event('a', 'queued', { position: 2, queue_length: 2 }));
    expect(store.label('a')).toBe('Queued · #2 in gpu');
    store.apply(event('a', 'queued', { position: 1 }));
    expect(store.label('a')).toBe('Queued · #1 in gpu');
    store.apply(event('a', 'admitted'));
    expect(store.label('a')).toBe('Admitted · 1 GPU');
    store.apply(event('a', 'running', { devices: ['0'] }));
    expect(store.label('a')).toBe('Running');
  });

  it('shows preemption, then the place in the queue again', () => {
    const { store } = loaded();
    store.apply(event('a', 'running'));
    store.apply(event('a', 'preempted', { saving: true, message: 'preempted: x; saving, then' }));
    expect(store.label('a')).toBe('Preempted · saving…');
    store.apply(event('a', 'requeued', { position: 1 }));
    expect(store.label('a')).toBe('Requeued · #1');
  });

  it('keeps each kernel apart: events for another kernel leave this one as it was', () => {
    const { store } = loaded();
    store.apply(event('mine', 'queued', { position: 2 }));
    store.apply(event('other', 'running'));
    store.apply(event('other', 'preempted', { message: 'preempted' }));
    expect(store.label('mine')).toBe('Queued · #2 in gpu');
    expect(store.label('other')).toBe('Preempted');
    expect(store.label('unknown')).toBeNull();
  });

  it('holds events until the listing is loaded, then applies them on top of it', () => {
    const store = new QueueStore({ longWaitMs: 10_000 });
    expect(store.apply(event('a', 'admitted'))).toEqual([]);
    expect(store.label('a')).toBeNull();
    store.load([
      { id: 'a', queue: event('a', 'queued', { position: 1 }), waiting_since: null },
      { id: 'b', queue: event('b', 'queued', { position: 2 }), waiting_since: null }
    ]);
    expect(store.label('a')).toBe('Admitted · 1 GPU');
    expect(store.label('b')).toBe('Queued · #2 in gpu');
  });

  it('resyncs from a later listing without losing the events that came meanwhile', () => {
    const { store } = loaded();
    store.apply(event('a', 'queued', { position: 2, queue_length: 2 }));
    store.apply(event('b', 'queued', { position: 1, queue_length: 2 }));
    store.hold(); // the listing is being fetched: events wait for it
    expect(store.apply(event('a', 'requeued', { position: 1 }))).toEqual([]);
    expect(store.label('a')).toBe('Queued · #2 in gpu'); // still what it was, until the listing
    // The listing says b was cancelled while the events were missed; a's event is newer.
    store.load([{ id: 'a', queue: event('a', 'running'), waiting_since: null }]);
    expect(store.label('a')).toBe('Requeued · #1');
    expect(store.label('b')).toBeNull();
  });

  it('applies held events to what it has when the listing cannot be fetched', () => {
    const { store } = loaded();
    store.apply(event('a', 'queued', { position: 2 }));
    store.hold();
    store.apply(event('a', 'running'));
    expect(store.resume()).toEqual([]);
    expect(store.label('a')).toBe('Running');
    expect(store.apply(event('a', 'failed', { message: 'boom' }))).toHaveLength(1);
  });

  it('rebuilds from the listing alone on reload, wait times included', () => {
    const clock = { now: Date.parse('2026-01-01T10:05:00Z') };
    const store = new QueueStore({ longWaitMs: 10_000, now: () => clock.now });
    const listing: ListingEntry[] = [
      { id: 'plain', queue: null },
      { id: 'gone', queue: event('gone', 'cancelled') },
      { id: 'run', queue: event('run', 'running'), waiting_since: null },
      {
        id: 'wait',
        queue: event('wait', 'queued', { position: 3, queue_length: 3, gpus: 2 }),
        waiting_since: '2026-01-01T10:00:00Z'
      }
    ];
    store.load(listing);
    expect(store.label('plain')).toBeNull();
    expect(store.label('gone')).toBeNull();
    expect(store.label('run')).toBe('Running');
    expect(store.queued()).toEqual([
      {
        kernelId: 'wait',
        state: 'queued',
        queue: 'gpu',
        position: 3,
        queueLength: 3,
        gpus: 2,
        waited: 5 * 60_000
      }
    ]);
  });

  it('lists waiting kernels by queue and position, with their wait so far', () => {
    const { store, clock } = loaded();
    store.apply(event('second', 'queued', { position: 2 }));
    clock.now += 1000;
    store.apply(event('first', 'queued', { position: 1 }));
    store.apply(event('cpu', 'queued', { queue: 'cpu', position: 1, gpus: 0 }));
    store.apply(event('live', 'running'));
    clock.now += 4000;
    const rows = store.queued();
    expect(rows.map(r => r.kernelId)).toEqual(['cpu', 'first', 'second']);
    expect(rows.map(r => r.waited)).toEqual([4000, 4000, 5000]);
  });

  it('keeps the start of a wait while the position changes', () => {
    const { store, clock } = loaded();
    store.apply(event('a', 'queued', { position: 2 }));
    clock.now += 3000;
    store.apply(event('a', 'queued', { position: 1 }));
    expect(store.queued()[0].waited).toBe(3000);
  });

  it('drops cancelled and shut-down kernels', () => {
    const { store } = loaded();
    store.apply(event('a', 'queued'));
    store.apply(event('b', 'queued'));
    store.apply(event('a', 'cancelled'));
    store.remove('b');
    expect(store.queued()).toEqual([]);
    expect(store.label('a')).toBeNull();
  });

  it('signals every change, and nothing where nothing changed', () => {
    const { store } = loaded();
    let calls = 0;
    const count = () => calls++;
    store.changed.connect(count);
    store.apply(event('a', 'queued'));
    store.remove('a');
    store.remove('a'); // nothing left to remove: no change
    store.changed.disconnect(count);
    store.apply(event('a', 'queued'));
    expect(calls).toBe(2);
  });
});

describe('parking', () => {
  const parking = 'parking after 2 s idle: saving its variables, then giving back its GPU';
  const parked =
    'parked after 2 s idle; GPU released; your next cell brings it back (saved 2 variables)';

  it('lists running and parked kernels with the action each offers, and gives the sentence', () => {
    const { store } = loaded();
    store.apply(event('b', 'running'));
    store.apply(event('a', 'parked', { message: parked }));
    store.apply(event('c', 'queued'));
    expect(store.kernels()).toEqual([
      { kernelId: 'a', state: 'parked', action: 'resume', message: parked, gpus: 1 },
      { kernelId: 'b', state: 'running', action: 'park', message: 'running', gpus: 1 }
    ]);
    expect(store.queued().map(r => r.kernelId)).toEqual(['c']);
    expect(store.sentence('a')).toBe(parked);
    expect(store.sentence('unknown')).toBeNull();
  });

  it('announces a park once it is parked, not while it saves, and once only', () => {
    const { store } = loaded();
    store.apply(event('a', 'running'));
    expect(store.apply(event('a', 'parked', { saving: true, message: parking }))).toEqual([]);
    expect(store.apply(event('a', 'parked', { message: parked }))).toEqual([
      { kernelId: 'a', kind: 'info', moment: 'parked', message: parked }
    ]);
    expect(store.apply(event('a', 'parked', { message: parked }))).toEqual([]);
  });

  it('follows a woken kernel back through its queue, and tells no preemption', () => {
    const { store } = loaded();
    store.apply(event('a', 'parked', { message: parked }));
    const waking = "waking from parked: queued in 'gpu', position 1 of 1, needs 1 GPU";
    expect(store.apply(event('a', 'requeued', { waking: true, message: waking }))).toEqual([]);
    expect(store.label('a')).toBe('Waking · #1');
    expect(store.queued().map(r => r.kernelId)).toEqual(['a']);
    store.apply(event('a', 'admitted'));
    const back = store.apply(event('a', 'resumed', { message: 'resumed; variables restored' }));
    expect(back.map(n => n.moment)).toEqual(['resumed']);
    expect(store.label('a')).toBe('Running');
  });
});

describe('notices', () => {
  it('announces an admission after a long wait, once', () => {
    const { store, clock } = loaded(10_000);
    store.apply(event('a', 'queued'));
    clock.now += 12_000;
    const notices = store.apply(event('a', 'admitted'));
    expect(notices).toEqual([
      {
        kernelId: 'a',
        kind: 'success',
        moment: 'admitted',
        message: 'kernel admitted with 1 GPU after waiting 12 s'
      }
    ]);
    expect(store.apply(event('a', 'running'))).toEqual([]);
  });

  it('stays quiet about a short wait', () => {
    const { store, clock } = loaded(10_000);
    store.apply(event('a', 'queued'));
    clock.now += 2_000;
    expect(store.apply(event('a', 'admitted'))).toEqual([]);
  });

  it('announces an admission that skipped the admitted state', () => {
    const { store, clock } = loaded(0);
    store.apply(event('a', 'queued'));
    clock.now += 1;
    expect(store.apply(event('a', 'running')).map(n => n.moment)).toEqual(['admitted']);
  });

  it('does not announce an admission it did not see the wait for', () => {
    const { store } = loaded(0);
    expect(store.apply(event('a', 'admitted'))).toEqual([]);
  });

  it('announces preemption with the reason, and the resume with the restore summary', () => {
    const { store } = loaded();
    store.apply(event('a', 'running'));
    const why = "preempted: evicted to admit kernel 9f3c (priority 'high'); saving its variables";
    expect(store.apply(event('a', 'preempted', { message: why }))).toEqual([
      { kernelId: 'a', kind: 'warning', moment: 'preempted', message: why }
    ]);
    expect(store.apply(event('a', 'requeued'))).toEqual([]);
    store.apply(event('a', 'admitted'));
    const summary = 'resumed with GPU 0; variables restored from the checkpoint';
    expect(store.apply(event('a', 'resumed', { message: summary }))).toEqual([
      { kernelId: 'a', kind: 'info', moment: 'resumed', message: summary }
    ]);
  });

  it('announces a preemption reported straight as requeued', () => {
    const { store } = loaded();
    store.apply(event('a', 'running'));
    expect(store.apply(event('a', 'requeued')).map(n => n.moment)).toEqual(['preempted']);
  });

  it('announces a failure with the error sentence', () => {
    const { store } = loaded();
    store.apply(event('a', 'queued'));
    const sentence = "kernel 1234abcd waited 30 s in 'gpu' without being admitted";
    const failed = event('a', 'failed', { message: sentence, failure: 'admission_timeout' });
    expect(store.apply(failed)).toEqual([
      { kernelId: 'a', kind: 'error', moment: 'failed', message: sentence }
    ]);
    // The item keeps saying why, with the whole sentence as its tooltip, until shut down.
    expect(store.label('a')).toBe('Failed · gave up waiting');
    expect(store.sentence('a')).toBe(sentence);
    expect(store.queued()).toEqual([]);
    store.remove('a');
    expect(store.label('a')).toBeNull();
  });

  it('keeps a kernel the listing says failed before any event, and forgets a finished one', () => {
    const store = new QueueStore({ longWaitMs: 0 });
    const failed = event('a', 'failed', {
      message: "kernel aaaa: queue 'nosuch' does not exist on the local backend; known queues: gpu.",
      failure: 'queue_not_found',
      queue: 'nosuch'
    });
    const notices = store.load([
      { id: 'a', queue: failed },
      { id: 'b', queue: event('b', 'finished') }
    ]);
    expect(notices).toEqual([]); // a reload does not announce an old failure again
    expect(store.label('a')).toBe("Failed · no queue 'nosuch'");
    expect(store.label('b')).toBeNull();
  });

  it('lists the failed kernels with their label and whole sentence, and every status', () => {
    const { store } = loaded();
    const sentence =
      "kernel bbbb: kernelspec 'typo': unknown config key `checkpoint_dir` (did you mean " +
      '`checkpoint`?); the keys are admission_timeout, backend, checkpoint';
    store.apply(event('b', 'failed', { message: sentence, failure: 'config' }));
    const timedOut = 'kernel aaaa waited 1 s without being admitted';
    store.apply(event('a', 'failed', { message: timedOut, failure: 'admission_timeout' }));
    store.apply(event('c', 'queued'));
    expect(store.failed()).toEqual([
      {
        kernelId: 'a',
        label: 'Failed · gave up waiting',
        message: 'kernel aaaa waited 1 s without being admitted'
      },
      { kernelId: 'b', label: 'Failed · kernelspec error', message: sentence }
    ]);
    expect(store.statuses().map(s => [s.kernel_id, s.state])).toEqual([
      ['b', 'failed'],
      ['a', 'failed'],
      ['c', 'queued']
    ]);
    store.remove('a');
    expect(store.failed().map(row => row.kernelId)).toEqual(['b']);
  });

  it('repeats nothing for a repeated state', () => {
    const { store } = loaded();
    store.apply(event('a', 'running'));
    store.apply(event('a', 'preempted', { message: 'p' }));
    expect(store.apply(event('a', 'preempted', { message: 'p, saved 3 variables' }))).toEqual([]);
  });
});
