import { describe, expect, it } from 'vitest';

import { failedLabel, indicatorText, namedKernels, spoken, toneOf } from '../look';
import { QueueStatus, statusLabel } from '../state';

function status(state: QueueStatus['state'], extra: Partial<QueueStatus> = {}): QueueStatus {
  return { kernel_id: 'k', state, message: state, queue: 'gpu', gpus: 1, ...extra };
}

describe('failedLabel', () => {
  it.each([
    [
      'kernel 1a2b3c4d asks for 3 GPU(s) but this machine has 2 pretend GPU(s) in all, so it ' +
        'could never start. Ask for fewer `gpus` in the kernelspec, or list more with ' +
        'c.LocalBackend.gpus.',
      'Failed · needs 3 GPUs, 2 exist'
    ],
    [
      'kernel 1a2b3c4d asks for 2 GPU(s) but this machine has 1 GPU(s) in all, so it could never',
      'Failed · needs 2 GPUs, 1 exists'
    ],
    [
      "kernel 1a2b3c4d: queue 'nosuch' does not exist on the local backend; known queues: gpu.",
      "Failed · no queue 'nosuch'"
    ],
    [
      "kernel 1a2b3c4d: LocalQueue 'lq' does not exist in namespace 'team'; LocalQueues there: a.",
      "Failed · no queue 'lq'"
    ],
    [
      "kernel 1a2b3c4d: priority class 'urgent' does not exist; known classes: high, low.",
      "Failed · no priority class 'urgent'"
    ],
    [
      "kernel 1a2b3c4d waited 1 s in 'gpu' without being admitted (admission_timeout)",
      'Failed · gave up waiting'
    ],
    [
      'kernel 1a2b3c4d asks for 64 CPU but the local quota is 16, so it could never start.',
      'Failed · needs 64 CPU, 16 exist'
    ],
    [
      "kernel 1a2b3c4d asks for 3 nvidia.com/gpu but ClusterQueue 'cluster-queue' can never " +
        'give more than 1, so it could never start.',
      'Failed · needs 3 GPUs, queue has 1'
    ],
    ['the launcher exited with code 1', 'Failed']
  ])('%s → %s', (message, label) => {
    expect(failedLabel(message)).toBe(label);
    expect(statusLabel(status('failed', { message }))).toBe(label);
  });
});

describe('failedLabel with the failure kind', () => {
  it('says the kind where the sentence is not one it knows', () => {
    expect(failedLabel('the kernel took 120 s to start', 'startup_timeout')).toBe(
      'Failed · did not start in time'
    );
    expect(failedLabel('something else', 'launch')).toBe('Failed');
    const status: QueueStatus = {
      kernel_id: 'k',
      state: 'failed',
      message: 'bad image',
      failure: 'config'
    };
    expect(statusLabel(status)).toBe('Failed · kernelspec error');
  });
});

describe('toneOf', () => {
  it.each([
    ['queued', {}, 'queued'],
    ['requeued', { message: "waking from parked: queued in 'gpu', position 1" }, 'queued'],
    ['requeued', { message: 'preempted by a higher-priority kernel' }, 'preempted'],
    ['preempted', {}, 'preempted'],
    ['admitted', {}, 'admitted'],
    ['running', {}, 'running'],
    ['resumed', {}, 'running'],
    ['parked', { message: 'parked on request; GPU released' }, 'parked'],
    ['parked', { message: 'parking after 30 s idle: saving…' }, 'preempted'],
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
    const failed = status('failed', { message: "queue 'x' does not exist" });
    expect(indicatorText(failed, statusLabel(failed))).toBe("Failed · no queue 'x'");
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
