import { describe, expect, it } from 'vitest';

import { MachineKernel, MachineQueue, machineView } from '../machine';

function kernel(extra: Partial<MachineKernel>): MachineKernel {
  return {
    kernel_id: 'aaaaaaaa-0000-0000-0000-000000000000',
    queue: 'gpu',
    state: 'admitted',
    devices: [],
    position: 0,
    uid: 1000,
    pid: 4242,
    user: 'ada',
    gpus: 1,
    here: false,
    ...extra
  };
}

function queue(extra: Partial<MachineQueue>): MachineQueue {
  return {
    service: { pid: 7, version: '0.1.0', system: false },
    gpus: ['0', '1'],
    gpus_in_use: 0,
    kernels: [],
    hidden: {},
    ...extra
  };
}

describe('machineView', () => {
  it('says nothing while no queue service runs', () => {
    expect(machineView(queue({ service: null }))).toBeNull();
  });

  it("shows the capacity and the other servers' kernels, not this server's", () => {
    const view = machineView(
      queue({
        gpus_in_use: 2,
        kernels: [
          kernel({ here: true, devices: ['0'] }),
          kernel({ kernel_id: 'bbbbbbbb-1111', devices: ['1'], pid: 99 }),
          kernel({ kernel_id: 'cccccccc-2222', state: 'queued', position: 1, pid: 99 })
        ]
      })
    );
    expect(view?.capacity).toBe('GPUs: 2 of 2 in use · 1 waiting');
    expect(view?.rows).toEqual([
      { who: 'kernel bbbbbbbb (another process, pid 99)', state: 'running', gpus: 'GPU 1' },
      { who: 'kernel cccccccc (another process, pid 99)', state: 'waiting, #1 in gpu', gpus: '1 GPU' }
    ]);
    expect(view?.hidden).toBe('');
  });

  it("names other users' kernels by user, or only counts them", () => {
    const named = machineView(
      queue({ kernels: [kernel({ kernel_id: '', pid: 0, user: 'grace', state: 'evicting' })] })
    );
    expect(named?.rows).toEqual([{ who: "grace's kernel", state: 'being preempted', gpus: '1 GPU' }]);
    const counted = machineView(queue({ gpus_in_use: 1, hidden: { admitted: 1, queued: 2 } }));
    expect(counted?.capacity).toBe('GPUs: 1 of 2 in use · 2 waiting');
    expect(counted?.hidden).toBe("Other users' kernels: 1 running, 2 waiting");
    expect(counted?.rows).toEqual([]);
  });
});
