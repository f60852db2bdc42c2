/**
 * The queues as the panel shows them (`GET /api/kernel-queue/queues`): a capacity line per
 * queue (once for the local machine, whose queues share its GPUs), then who holds the queue and
 * who waits in it, each row with what its button does. This server's kernels are named by their
 * notebook; another process's or user's kernel as the machine's queue lists it (`machine.ts`'s
 * words). Pure: no DOM, no requests; the words through the translation bundle `trans`.
 */

import type { TranslationBundle } from '@jupyterlab/translation';

import { ENGLISH, gpuCount } from './look';
import { formatWait } from './state';

/** One kernel of a queue, as `kernel_queue/server/queues.py` lists it. */
export interface QueueKernel {
  kernel_id: string;
  notebook: string | null;
  state: string;
  gpus: number;
  devices: string[];
  position: number | null;
  waiting_since: string | null;
  idle_since: string | null;
  execution_state: string | null;
  message: string;
  here: boolean;
  user?: string;
  pid?: number;
}

export interface QueueInfo {
  name: string;
  capacity: { gpus: number } | null;
  in_use: { gpus: number } | null;
  /** True when every queue shares the capacity (the local machine's GPUs). */
  shared?: boolean;
  /** Kueue's LocalQueue counts (kubernetes backend). */
  pending?: number;
  admitted?: number;
  /** Why the LocalQueue could not be read (kubernetes backend), else null or absent. */
  error?: string | null;
  holders: QueueKernel[];
  waiting: QueueKernel[];
}

export interface QueuesListing {
  backend: string | null;
  queues: QueueInfo[];
  hidden: Record<string, number>;
}

/** What a row's button does: leave the queue (a waiting kernel), shut a holder down. */
export type RowAction = 'leave' | 'shutdown' | null;

export interface QueueRowView {
  kernelId: string;
  /** The notebook's name, or who else holds or waits. */
  who: string;
  /** e.g. "running · idle 3 min 05 s", "busy", "#1 of 2 · waiting 45 s". */
  state: string;
  gpus: string;
  action: RowAction;
  /** Whether the kernel holds the queue's GPUs or waits for them. */
  role: 'holder' | 'waiting';
  /** The row of the notebook in view. */
  current: boolean;
  /** The server's sentence, as the row's tooltip. */
  title: string;
}

export interface QueueView {
  name: string;
  /** "1 of 2 GPUs in use · 1 waiting"; empty where the queue's own line is left out. */
  capacity: string;
  /** Why the queue's counts are missing (the server's sentence), else empty. */
  error: string;
  rows: QueueRowView[];
}

export interface QueuesView {
  /** The one capacity line of a machine whose queues share its GPUs, else empty. */
  shared: string;
  queues: QueueView[];
  hidden: string;
}

function since(iso: string | null, now: number): number | null {
  const ms = iso ? Date.parse(iso) : NaN;
  return Number.isNaN(ms) ? null : Math.max(0, now - ms);
}

function basename(path: string): string {
  return path.split('/').pop() || path;
}

/** Who a row is about: the notebook, else what the machine's queue says of the process. */
export function who(
  kernel: QueueKernel,
  name: (kernelId: string) => string,
  trans: TranslationBundle = ENGLISH
): string {
  if (kernel.here) {
    return kernel.notebook ? basename(kernel.notebook) : name(kernel.kernel_id);
  }
  if (!kernel.kernel_id) {
    return kernel.user ? trans.__("%1's kernel", kernel.user) : trans.__("another user's kernel");
  }
  return trans.__(
    'kernel %1 (another process, pid %2)',
    kernel.kernel_id.slice(0, 8),
    kernel.pid ?? 0
  );
}

function holderState(kernel: QueueKernel, now: number, trans: TranslationBundle): string {
  if (kernel.state === 'preempted') {
    return trans.__('preempted · saving');
  }
  if (kernel.execution_state === 'busy') {
    return trans.__('running · busy');
  }
  const idle = since(kernel.idle_since, now);
  return idle === null
    ? trans.__('running')
    : trans.__('running · idle %1', formatWait(idle, trans));
}

function waitingState(
  kernel: QueueKernel,
  length: number,
  now: number,
  trans: TranslationBundle
): string {
  const place = kernel.position
    ? trans.__('#%1 of %2', kernel.position, length)
    : trans.__('waiting');
  const waited = since(kernel.waiting_since, now);
  return waited === null
    ? place
    : trans.__('%1 · waiting %2', place, formatWait(waited, trans));
}

function gpus(kernel: QueueKernel, trans: TranslationBundle): string {
  return kernel.devices.length
    ? trans.__('GPU %1', kernel.devices.join(', '))
    : gpuCount(kernel.gpus, trans);
}

function capacityLine(queue: QueueInfo, waiting: number, trans: TranslationBundle): string {
  const used = queue.in_use?.gpus;
  const parts: string[] = [];
  if (queue.capacity && used !== undefined) {
    parts.push(trans.__('%1 of %2 in use', used, gpuCount(queue.capacity.gpus, trans)));
  } else if (used !== undefined) {
    parts.push(trans.__('%1 in use', gpuCount(used, trans)));
  }
  if (queue.pending !== undefined) {
    parts.push(
      trans.__('%1 admitted, %2 pending in Kueue', queue.admitted ?? 0, queue.pending)
    );
  } else if (waiting) {
    parts.push(trans.__('%1 waiting', waiting));
  }
  return parts.join(' · ');
}

/** The machine's line, as the lead's "This machine" section said it: "GPUs: 1 of 2 in use ·
 * 1 waiting" (other users' waiting kernels counted too). */
function sharedLine(queue: QueueInfo, waiting: number, trans: TranslationBundle): string {
  const used = queue.in_use?.gpus ?? 0;
  const line = queue.capacity
    ? trans.__('GPUs: %1 of %2 in use', used, queue.capacity.gpus)
    : trans.__('GPUs: %1 in use', used);
  return waiting ? trans.__('%1 · %2 waiting', line, waiting) : line;
}

/** Other users' kernels by state, in words: "2 waiting". */
function hiddenWords(state: string, count: number, trans: TranslationBundle): string {
  switch (state) {
    case 'queued':
      return trans.__('%1 waiting', count);
    case 'admitted':
      return trans.__('%1 running', count);
    case 'evicting':
      return trans.__('%1 being preempted', count);
    default:
      return `${count} ${state}`;
  }
}

/**
 * The panel's view of `listing`: `current` is the kernel of the notebook in view, `name`
 * names a kernel without a notebook, `now` is the clock (ms). Queues with nobody in them are
 * left out where the machine's line says their shared capacity.
 */
export function queuesView(
  listing: QueuesListing,
  current: string | null,
  name: (kernelId: string) => string,
  now: number,
  trans: TranslationBundle = ENGLISH
): QueuesView {
  // A LocalQueue's own counts are worth a line even without this server's kernels in it.
  const shown = listing.queues.filter(q => q.holders.length + q.waiting.length > 0 || !q.shared);
  const sharing = listing.queues.find(q => q.shared);
  const waitingAll =
    listing.queues.reduce((n, q) => n + q.waiting.length, 0) + (listing.hidden['queued'] ?? 0);
  const shared = sharing ? sharedLine(sharing, waitingAll, trans) : '';
  const queues = shown.map(queue => {
    const row = (kernel: QueueKernel, holding: boolean): QueueRowView => ({
      kernelId: kernel.kernel_id,
      who: who(kernel, name, trans),
      state: holding
        ? holderState(kernel, now, trans)
        : waitingState(kernel, queue.waiting.length, now, trans),
      gpus: gpus(kernel, trans),
      action: kernel.here ? (holding ? 'shutdown' : 'leave') : null,
      role: holding ? 'holder' : 'waiting',
      current: kernel.here && kernel.kernel_id === current,
      title: kernel.message
    });
    return {
      name: queue.name,
      capacity: queue.shared ? '' : capacityLine(queue, queue.waiting.length, trans),
      error: queue.error ?? '',
      rows: [...queue.holders.map(k => row(k, true)), ...queue.waiting.map(k => row(k, false))]
    };
  });
  const counts = Object.entries(listing.hidden)
    .filter(([, count]) => count > 0)
    .map(([state, count]) => hiddenWords(state, count, trans));
  const hidden = counts.length ? trans.__("Other users' kernels: %1", counts.join(', ')) : '';
  return { shared, queues, hidden };
}
