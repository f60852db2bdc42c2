/**
 * The machine's whole local queue (`GET /api/kernel-queue/machine`), as the panel shows it:
 * the capacity line, the kernels of this user's other servers and batch runs, and other users'
 * kernels (by user name, or only counted where the machine's privacy setting says so).
 * Pure: no DOM, no requests.
 */

/** One kernel in the machine's listing (kernel_queue/machine/protocol.py's Entry, + `here`). */
export interface MachineKernel {
  kernel_id: string;
  queue: string;
  state: 'queued' | 'admitted' | 'evicting';
  devices: string[];
  position: number;
  uid: number;
  pid: number;
  user: string;
  gpus: number;
  here: boolean;
}

export interface MachineQueue {
  service: { pid: number; version: string; system: boolean } | null;
  gpus: string[];
  gpus_in_use: number;
  kernels: MachineKernel[];
  hidden: Record<string, number>;
}

/** A row of the panel's "This machine" table. */
export interface MachineRow {
  who: string;
  state: string;
  gpus: string;
}

export interface MachineView {
  capacity: string;
  rows: MachineRow[];
  hidden: string;
}

const STATE_WORDS: Record<string, string> = {
  queued: 'waiting',
  admitted: 'running',
  evicting: 'being preempted'
};

function plural(count: number, one: string, many: string): string {
  return `${count} ${count === 1 ? one : many}`;
}

/** What the panel says of the machine; null when no queue service runs (nothing queued). */
export function machineView(queue: MachineQueue): MachineView | null {
  if (queue.service === null) {
    return null;
  }
  const waiting =
    queue.kernels.filter(k => k.state === 'queued').length + (queue.hidden['queued'] ?? 0);
  const capacity =
    `GPUs: ${queue.gpus_in_use} of ${queue.gpus.length} in use` +
    (waiting ? ` · ${waiting} waiting` : '');
  const rows = queue.kernels
    .filter(k => !k.here)
    .map(k => {
      // Another user's kernel comes without its id (the service's privacy rule).
      const who = k.kernel_id
        ? `kernel ${k.kernel_id.slice(0, 8)} (another process, pid ${k.pid})`
        : `${k.user || 'another user'}'s kernel`;
      const state =
        k.state === 'queued' ? `waiting, #${k.position} in ${k.queue}` : STATE_WORDS[k.state];
      const gpus = k.devices.length ? `GPU ${k.devices.join(', ')}` : plural(k.gpus, 'GPU', 'GPUs');
      return { who, state, gpus };
    });
  const counts = Object.entries(queue.hidden)
    .filter(([, count]) => count > 0)
    .map(([state, count]) => `${count} ${STATE_WORDS[state] ?? state}`);
  const hidden = counts.length ? `Other users' kernels: ${counts.join(', ')}` : '';
  return { capacity, rows, hidden };
}
