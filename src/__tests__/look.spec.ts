import { describe, expect, it } from 'vitest';

import { ENGLISH, failedLabel, indicatorText, namedKernels, spoken, toneOf } from '../look';
import { QueueStatus, statusLabel } from '../state';

function status(state: QueueStatus['state'], extra: Partial<QueueStatus> = {}): QueueStatus {
  return { kernel_id: 'k', state, message: state, queue: 'gpu', gpus: 1, ...extra };
}

/** A failed kernel's status as the server (schema version 5) sends it. */
function failed(extra: Partial<QueueStatus>): QueueStatus {
  return status('failed', { backend: 'local', message: 'the sentence, whole', ...extra });
}

describe('failedLabel reads the event’s fields, never the sentence', () => {
  it.each([
    [
      { failure: 'never_fits', needs: '3 GPUs', gpus: 3, has: { gpus: 2 } },
      'Failed · needs 3 GPUs, 2 exist'
    ],
    [
      { failure: 'never_fits', needs: '2 GPUs', gpus: 2, has: { gpus: 1 } },
      'Failed · needs 2 GPUs, 1 exists'
    ],
    [
      { failure: 'never_fits', needs: '64 CPU', gpus: 0, has: { cpu: '16' } },
      'Failed · needs 64 CPU, 16 exist'
    ],
    [
      { failure: 'never_fits', backend: 'kubernetes', needs: '3 GPUs', gpus: 3, has: { gpus: 1 } },
      'Failed · needs 3 GPUs, queue has 1'
    ],
    // The server does not always know what its queue could give: what the kernel needs, then.
    [{ failure: 'never_fits', needs: '3 GPUs', gpus: 3, has: null }, 'Failed · needs 3 GPUs, can never fit'],
    [{ failure: 'queue_not_found', queue: 'nosuch' }, "Failed · no queue 'nosuch'"],
    [
      { failure: 'priority_class_not_found', priority_class: 'urgent' },
      "Failed · no priority class 'urgent'"
    ],
    [{ failure: 'priority_class_not_found', priority_class: null }, 'Failed · no such priority class'],
    [{ failure: 'admission_timeout' }, 'Failed · gave up waiting'],
    [{ failure: 'startup_timeout' }, 'Failed · did not start in time'],
    [{ failure: 'config' }, 'Failed · kernelspec error'],
    [{ failure: 'launch' }, 'Failed'],
    [{ failure: null }, 'Failed']
  ] as [Partial<QueueStatus>, string][])('%j → %s', (fields, label) => {
    expect(failedLabel(failed(fields))).toBe(label);
    expect(statusLabel(failed(fields))).toBe(label);
  });

  it('says nothing the sentence says when the fields do not: a sentence alone is plain Failed', () => {
    const message = "kernel 1a2b3c4d: queue 'nosuch' does not exist on the local backend";
    expect(failedLabel(status('failed', { message }))).toBe('Failed');
  });
});

describe('labels through a translator', () => {
  it('passes every word through the bundle, with counts in their plural', () => {
    const seen: string[] = [];
    const trans = {
      ...ENGLISH,
      __: (msgid: string, ...args: unknown[]) => {
        seen.push(msgid);
        return ENGLISH.__(msgid.toUpperCase(), ...(args as string[]));
      },
      _n: (one: string, many: string, n: number, ...args: unknown[]) => {
        seen.push(one);
        return ENGLISH._n(one.toUpperCase(), many.toUpperCase(), n, ...(args as string[]));
      }
    } as typeof ENGLISH;
    const queued = status('queued', { position: 2, gpus: 2 });
    expect(statusLabel(queued, trans)).toBe('QUEUED · #2 IN gpu');
    expect(indicatorText(queued, statusLabel(queued, trans), null, trans)).toBe(
      'WAITING FOR 2 GPUS · #2 IN gpu'
    );
    expect(failedLabel(failed({ failure: 'queue_not_found', queue: 'x' }), trans)).toBe(
      "FAILED · NO QUEUE 'x'"
    );
    expect(seen).toContain('%1 GPU');
  });
});

describe('toneOf', () => {
  it.each([
    ['queued', {}, 'queued'],
    ['requeued', { waking: true }, 'queued'],
    ['requeued', { message: 'preempted by a higher-priority kernel' }, 'preempted'],
    ['preempted', {}, 'preempted'],
    ['admitted', {}, 'admitted'],
    ['running', {}, 'running'],
    ['resumed', {}, 'running'],
    ['parked', { message: 'parked on request; GPU released' }, 'parked'],
    ['parked', { saving: true }, 'preempted'],
    ['parked', { message: 'parking after 30 s idle: saving…' }, 'parked'], // fields, not words
    ['failed', {}, 'failed']
  ] as const)('%s (%o) looks %s', (state, extra, tone) => {
    expect(toneOf(status(state, extra))).toBe(tone);
  });
});

describe('indicatorText', () => {
  it('says what the kernel waits for, while it waits, and nothing once it runs', () => {
    const queued = status('queued', { position: 2, gpus: 2 });
    expect(indicatorText(queued, statusLabel(queued))).toBe('Waiting for 2 GPUs · #2 in gpu');
    const admitted = status('admitted');
    expect(indicatorText(admitted, statusLabel(admitted))).toBe('Admitted · 1 GPU · starting');
    const lost = status('failed', { failure: 'queue_not_found', queue: 'x' });
    expect(indicatorText(lost, statusLabel(lost))).toBe("Failed · no queue 'x'");
    const estimated = status('queued', { position: 1, estimated_wait_seconds: 240 });
    expect(indicatorText(estimated, statusLabel(estimated), '~4 min')).toBe(
      'Waiting for 1 GPU · #1 in gpu · ~4 min'
    );
    for (const state of ['running', 'resumed', 'parked'] as const) {
      expect(indicatorText(status(state), statusLabel(status(state)))).toBeNull();
    }
  });
});

describe('spoken', () => {
  it('reads the label then the whole sentence', () => {
    expect(spoken('Queued · #1 in gpu', "queued in 'gpu', position 1 of 1")).toBe(
      "Kernel queue: Queued · #1 in gpu. queued in 'gpu', position 1 of 1"
    );
    expect(spoken('Queue · 2 waiting', null)).toBe('Kernel queue: Queue · 2 waiting');
  });
});

describe('namedKernels', () => {
  const names: Record<string, string> = { '844a8577': 'train.ipynb' };
  const name = (id: string) => names[id] ?? null;

  it('says a kernel of a notebook open here as that notebook', () => {
    expect(
      namedKernels('preempted by higher-priority kernel 844a8577, which needs 1 GPU', name)
    ).toBe('preempted by higher-priority train.ipynb (kernel 844a8577), which needs 1 GPU');
  });

  it('leaves another user’s kernel, and words that only look alike, as they are', () => {
    expect(namedKernels('preempted by higher-priority kernel 1a2b3c4d', name)).toBe(
      'preempted by higher-priority kernel 1a2b3c4d'
    );
    expect(namedKernels('kernel 844a8577x is not a short id', name)).toBe(
      'kernel 844a8577x is not a short id'
    );
  });
});
