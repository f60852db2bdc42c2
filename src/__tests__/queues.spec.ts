import { describe, expect, it } from 'vitest';

import { QueueInfo, QueueKernel, QueuesListing, queuesView } from '../queues';

const NOW = Date.parse('2026-12-01T12:10:00Z');

function kernel(extra: Partial<QueueKernel>): QueueKernel {
  return {
    kernel_id: 'aaaaaaaa-0000',
    notebook: null,
    state: 'running',
    gpus: 1,
    devices: [],
    position: null,
    waiting_since: null,
    idle_since: null,
    execution_state: 'idle',
    message: '',
    here: true,
    ...extra
  };
}

function queue(extra: Partial<QueueInfo>): QueueInfo {
  return {
    name: 'gpu',
    capacity: { gpus: 2 },
    in_use: { gpus: 0 },
    shared: true,
    holders: [],
    waiting: [],
    ...extra
  };
}

function listing(queues: QueueInfo[], hidden: Record<string, number> = {}): QueuesListing {
  return { backend: 'local', queues, hidden };
}

const named = (id: string) => `kernel ${id.slice(0, 8)}`;

describe('queuesView', () => {
  it('shows the holders with idle time, the waiting with their place, and marks the current', () => {
    const gpu = queue({
      in_use: { gpus: 2 },
      holders: [
        kernel({
          kernel_id: 'h1',
          notebook: 'work/train.ipynb',
          devices: ['0'],
          idle_since: '2026-12-01T12:06:55Z',
          message: 'running on GPU 0'
        }),
        kernel({ kernel_id: 'h2', execution_state: 'busy', devices: ['1'] }),
        kernel({ kernel_id: '', here: false, user: 'grace', devices: [] })
      ],
      waiting: [
        kernel({
          kernel_id: 'w1',
          notebook: 'second.ipynb',
          state: 'queued',
          position: 1,
          waiting_since: '2026-12-01T12:09:15Z'
        })
      ]
    });
    const view = queuesView(listing([gpu, queue({ name: 'batch' })]), 'w1', named, NOW);
    expect(view.shared).toBe('GPUs: 2 of 2 in use · 1 waiting');
    expect(view.queues.map(q => q.name)).toEqual(['gpu']); // the empty queue is left out
    expect(view.queues[0].rows).toEqual([
      {
        kernelId: 'h1',
        who: 'train.ipynb',
        state: 'running · idle 3 min 05 s',
        gpus: 'GPU 0',
        action: 'shutdown',
        role: 'holder',
        current: false,
        title: 'running on GPU 0'
      },
      expect.objectContaining({ who: 'kernel h2', state: 'running · busy', action: 'shutdown' }),
      expect.objectContaining({ who: "grace's kernel", gpus: '1 GPU', action: null }),
      expect.objectContaining({
        who: 'second.ipynb',
        state: '#1 of 1 · waiting 45 s',
        action: 'leave',
        role: 'waiting',
        current: true
      })
    ]);
  });

  it("names another process's kernel by id and pid, and counts other users' hidden ones", () => {
    const gpu = queue({
      in_use: { gpus: 1 },
      holders: [kernel({ kernel_id: 'bbbbbbbb-1111', here: false, pid: 99, devices: ['1'] })]
    });
    const view = queuesView(listing([gpu], { admitted: 1, queued: 2 }), null, named, NOW);
    expect(view.shared).toBe('GPUs: 1 of 2 in use · 2 waiting');
    expect(view.queues[0].rows[0].who).toBe('kernel bbbbbbbb (another process, pid 99)');
    expect(view.hidden).toBe("Other users' kernels: 1 running, 2 waiting");
  });

  it("says why a LocalQueue's counts are missing, and keeps its rows", () => {
    const why = "LocalQueue 'gpu' in namespace 'default': could not read its status: forbidden";
    const lq = queue({ shared: false, capacity: null, in_use: null, error: why });
    const view = queuesView({ backend: 'kubernetes', queues: [lq], hidden: {} }, null, named, NOW);
    expect(view.queues[0].error).toBe(why);
    expect(view.queues[0].capacity).toBe('');
    const read = queue({ shared: false, capacity: null, in_use: { gpus: 1 }, error: null });
    expect(queuesView({ backend: 'kubernetes', queues: [read], hidden: {} }, null, named, NOW)
      .queues[0].error).toBe('');
  });

  it("says a LocalQueue's own counts on the kubernetes backend, without a capacity", () => {
    const lq = queue({ shared: false, capacity: null, in_use: { gpus: 3 }, pending: 4, admitted: 2 });
    const view = queuesView({ backend: 'kubernetes', queues: [lq], hidden: {} }, null, named, NOW);
    expect(view.shared).toBe('');
    expect(view.queues[0].capacity).toBe('3 GPUs in use · 2 admitted, 4 pending in Kueue');
  });

  it('still says the capacity when nothing holds or waits', () => {
    const view = queuesView(listing([queue({})]), null, named, NOW);
    expect(view.shared).toBe('GPUs: 0 of 2 in use');
    expect(view.queues).toEqual([]);
  });
});
