import { describe, expect, it } from 'vitest';

import type { LabIcon } from '@jupyterlab/ui-components';

import { Tone } from '../look';
import { listed, QueueSessions, SECTION_NAME, shutdownAllText, sidebarItems } from '../running';
import { QueueStatus, QueueStore } from '../state';

function status(
  kernelId: string,
  state: QueueStatus['state'],
  extra: Partial<QueueStatus> = {}
): QueueStatus {
  return { kernel_id: kernelId, state, message: `${state} sentence`, queue: 'gpu', gpus: 1, ...extra };
}

const names: Record<string, string> = { a: 'first.ipynb', b: 'second.ipynb', c: 'third.ipynb' };
const name = (id: string) => names[id] ?? `kernel ${id.slice(0, 8)}`;

describe('listed', () => {
  it.each([
    ['queued', true],
    ['admitted', true],
    ['preempted', true],
    ['requeued', true],
    ['parked', true],
    ['failed', true],
    ['running', false],
    ['resumed', false],
    ['finished', false],
    ['cancelled', false]
  ] as [QueueStatus['state'], boolean][])('%s: %s', (state, expected) => {
    expect(listed(status('k', state))).toBe(expected);
  });
});

describe('sidebarItems', () => {
  it('lists a waiting kernel by its notebook, with its label, tone and whole sentence', () => {
    const sentence =
      "queued in 'gpu', position 1 of 1: waiting for 1 GPU(s); kernel 1a2b3c4d holds GPU 0";
    const items = sidebarItems(
      [status('a', 'running'), status('b', 'queued', { position: 1, message: sentence })],
      name
    );
    expect(items).toEqual([
      {
        kernelId: 'b',
        name: 'second.ipynb',
        tone: 'queued',
        detail: 'Queued · #1 in gpu',
        title: sentence,
        waiting: true,
        shutdownLabel: 'Leave the queue: shut down the waiting kernel of second.ipynb'
      }
    ]);
  });

  it('orders starting kernels first, then waiting ones by queue and place, parked, failed', () => {
    const items = sidebarItems(
      [
        status('failed1', 'failed', {
          message: 'kernel failed1 asks for 3 GPU(s) but this machine has 1 GPU(s) in all',
          backend: 'local',
          failure: 'never_fits',
          needs: '3 GPUs',
          gpus: 3,
          has: { gpus: 1 }
        }),
        status('parked1', 'parked', { message: 'parked on request; GPU released' }),
        status('c', 'queued', { position: 2 }),
        status('b', 'requeued', { position: 1 }),
        status('x', 'queued', { queue: 'cpu', position: 5 }),
        status('a', 'admitted')
      ],
      name
    );
    expect(items.map(i => [i.name, i.tone, i.detail])).toEqual([
      ['first.ipynb', 'admitted', 'Admitted · 1 GPU'],
      ['kernel x', 'queued', 'Queued · #5 in cpu'],
      ['second.ipynb', 'preempted', 'Requeued · #1'],
      ['third.ipynb', 'queued', 'Queued · #2 in gpu'],
      ['kernel parked1', 'parked', 'Parked · GPU released'],
      ['kernel failed1', 'failed', 'Failed · needs 3 GPUs, 1 exists']
    ]);
    expect(items.map(i => i.waiting)).toEqual([false, true, true, true, false, false]);
    expect(items[0].shutdownLabel).toBe('Shut down the kernel of first.ipynb');
  });

  it('falls back to the label as tooltip when the server gave no sentence', () => {
    const [item] = sidebarItems([status('a', 'admitted', { message: '' })], name);
    expect(item.title).toBe('Admitted · 1 GPU');
  });
});

describe('shutdownAllText', () => {
  it('says how many and that waiting kernels leave their queue', () => {
    const items = sidebarItems([status('a', 'queued'), status('b', 'failed')], name);
    expect(shutdownAllText(items)).toBe(
      'Shut down all 2 kernels listed under Kernel Queue? Waiting kernels leave their queue; ' +
        'any variables are lost.'
    );
    expect(shutdownAllText(items.slice(1))).toBe(
      'Shut down the 1 kernel listed under Kernel Queue? Any variables are lost.'
    );
  });
});

describe('QueueSessions', () => {
  function section() {
    const store = new QueueStore({ longWaitMs: 0 });
    store.load([]);
    const calls: string[] = [];
    const icons = Object.fromEntries(
      ['queued', 'admitted', 'running', 'preempted', 'parked', 'failed'].map(t => [
        t,
        { name: `icon-${t}` } as unknown as LabIcon
      ])
    ) as Record<Tone, LabIcon>;
    const manager = new QueueSessions(store, {
      name,
      icons,
      open: id => calls.push(`open ${id}`),
      shutdown: async id => {
        calls.push(`shutdown ${id}`);
        store.remove(id);
      },
      refresh: () => calls.push('refresh')
    });
    return { store, manager, calls };
  }

  it('follows the store: each change is signalled and read again', () => {
    const { store, manager } = section();
    let signals = 0;
    manager.runningChanged.connect(() => signals++);
    expect(manager.name).toBe(SECTION_NAME);
    expect(manager.running()).toEqual([]);
    store.apply(status('b', 'queued', { position: 1, message: 'queued in gpu, position 1' }));
    expect(signals).toBe(1);
    const [item] = manager.running();
    expect(item.label()).toBe('second.ipynb');
    expect(item.labelTitle?.()).toBe('queued in gpu, position 1');
    expect(item.detail?.()).toBe('Queued · #1 in gpu');
    expect((item.icon() as unknown as { name: string }).name).toBe('icon-queued');
    expect(item.className).toBe('jp-KernelQueue-runningItem jp-KernelQueue-running-queued');
    expect(manager.shutdownLabel(item)).toBe(
      'Leave the queue: shut down the waiting kernel of second.ipynb'
    );
    store.apply(status('b', 'running'));
    expect(signals).toBe(2);
    expect(manager.running()).toEqual([]);
  });

  it('opens, shuts one down, shuts all down and refreshes through the plugin', () => {
    const { store, manager, calls } = section();
    store.apply(status('a', 'admitted'));
    store.apply(status('b', 'queued'));
    store.apply(status('c', 'running'));
    const items = manager.running();
    items[1].open?.();
    items[1].shutdown?.();
    expect(calls).toEqual(['open b', 'shutdown b']);
    expect(manager.running().map(i => i.label())).toEqual(['first.ipynb']);
    expect(manager.shutdownAllConfirmationText()).toBe(
      'Shut down the 1 kernel listed under Kernel Queue? Any variables are lost.'
    );
    manager.shutdownAll();
    expect(calls).toEqual(['open b', 'shutdown b', 'shutdown a']);
    expect(manager.running()).toEqual([]);
    expect(store.get('c')?.status.state).toBe('running'); // not the section's to shut down
    manager.refreshRunning();
    expect(calls.at(-1)).toBe('refresh');
    manager.dispose();
    store.apply(status('b', 'queued'));
    expect(manager.running()).toHaveLength(1); // still readable, no longer signalled
  });
});
