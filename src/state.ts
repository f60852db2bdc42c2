/**
 * What JupyterLab knows about queued kernels, as plain data: no DOM, no JupyterLab services.
 *
 * `QueueStore` is fed the server's REST listing (at page load) and its status events (as they
 * come); it answers what the status bar reads for one kernel, which kernels the panel lists, and
 * which notifications a change deserves, and says each change with its Lumino signal `changed`.
 * The `kernel-queue:store` plugin (`store.ts`) owns every side effect.
 */

import type { TranslationBundle } from '@jupyterlab/translation';
import { ISignal, Signal } from '@lumino/signaling';

import { ENGLISH, failedLabel, gpuCount, isParking, isWaking, placeWords } from './look';
import type { KernelState, QueueStatus } from './status';

export type { KernelState, QueueStatus };

/** One entry of `GET /api/kernel-queue/kernels`: a Jupyter kernel model plus its queue state. */
export interface ListingEntry {
  id: string;
  name?: string;
  execution_state?: string;
  queue: QueueStatus | null;
  /** ISO time the kernel started its current wait in the queue, null when not waiting. */
  waiting_since?: string | null;
}

/** What the store keeps per kernel. */
export interface KernelEntry {
  status: QueueStatus;
  /** When the current wait began (ms since the epoch), null while not waiting. */
  waitingSince: number | null;
  /** Milliseconds the latest wait lasted, once it ended in an admission. */
  waited: number | null;
}

/** A notification the plugin should show. `kind` picks the JupyterLab Notification type. */
export interface Notice {
  kernelId: string;
  kind: 'info' | 'success' | 'warning' | 'error';
  /** The moment: admitted after a long wait, preempted, resumed, failed. */
  moment: 'admitted' | 'preempted' | 'parked' | 'resumed' | 'failed';
  message: string;
}

/** One row of the queued-kernels panel. */
export interface PanelRow {
  kernelId: string;
  state: KernelState;
  queue: string;
  position: number | null;
  queueLength: number | null;
  gpus: number;
  /** Milliseconds waited so far, null when the server did not say when the wait began. */
  waited: number | null;
}

/** One row of the panel's list of running and parked kernels, each with its action. */
export interface KernelRow {
  kernelId: string;
  state: KernelState;
  /** What the row's button does: park a running kernel, resume a parked one. */
  action: 'park' | 'resume';
  /** The server's sentence (the parked reason says what was saved). */
  message: string;
  gpus: number;
}

/** One failed kernel of the panel: why it failed, shortly and in the server's words. */
export interface FailedRow {
  kernelId: string;
  /** "Failed · needs 3 GPUs, can never fit" (look.ts's `failedLabel`). */
  label: string;
  /** The server's whole sentence. */
  message: string;
}

export { gpuCount };

/** States in which a kernel waits for (re-)admission (lifecycle.WAITING on the server). */
export const WAITING: ReadonlySet<KernelState> = new Set(['queued', 'preempted', 'requeued']);
/** States after which nothing more happens to the kernel. */
export const TERMINAL: ReadonlySet<KernelState> = new Set(['finished', 'failed', 'cancelled']);
/** Terminal states the store forgets at once; a failed kernel is kept (its item says why)
 * until the kernel is shut down or gone. */
const FORGOTTEN: ReadonlySet<KernelState> = new Set(['finished', 'cancelled']);
export const LIVE: ReadonlySet<KernelState> = new Set(['running', 'resumed']);


/** A wait as a person says it: "45 s", "3 min 05 s", "2 h 07 min". */
export function formatWait(ms: number, trans: TranslationBundle = ENGLISH): string {
  const seconds = Math.max(0, Math.floor(ms / 1000));
  if (seconds < 60) {
    return trans.__('%1 s', seconds);
  }
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) {
    return trans.__('%1 min %2 s', minutes, String(seconds % 60).padStart(2, '0'));
  }
  return trans.__('%1 h %2 min', Math.floor(minutes / 60), String(minutes % 60).padStart(2, '0'));
}

/** The server's estimate of a wait, shortly: "~40 s", "~4 min", "~2 h", "> 1 day". */
export function formatEstimate(seconds: number, trans: TranslationBundle = ENGLISH): string {
  if (seconds < 60) {
    return trans.__('~%1 s', Math.round(seconds));
  }
  if (seconds < 3600) {
    return trans.__('~%1 min', Math.round(seconds / 60));
  }
  return seconds < 86_400 ? trans.__('~%1 h', Math.round(seconds / 3600)) : trans.__('> 1 day');
}

/** A waiting kernel's estimate as the labels say it ("~4 min"), null without one. */
export function estimateOf(status: QueueStatus, trans: TranslationBundle = ENGLISH): string | null {
  const seconds = status.estimated_wait_seconds;
  return seconds != null ? formatEstimate(seconds, trans) : null;
}

/**
 * The status-bar text for one kernel's status: `Queued · #2 in gpu`, `Queued · #2 in gpu ·
 * ~4 min` (with the server's estimate), `Admitted · 1 GPU`, `Running`, `Preempted · saving…`,
 * `Requeued · #1`, `Parking · saving…`, `Parked · GPU released`, `Waking · #1`,
 * `Failed · needs 3 GPUs, 2 exist` (look.ts's `failedLabel`), ...
 */
export function statusLabel(status: QueueStatus, trans: TranslationBundle = ENGLISH): string {
  const place = placeWords(status, estimateOf(status, trans), trans);
  switch (status.state) {
    case 'queued':
      return [trans.__('Queued'), ...place].join(' · ');
    case 'admitted':
      return status.gpus
        ? trans.__('Admitted · %1', gpuCount(status.gpus, trans))
        : trans.__('Admitted');
    case 'running':
    case 'resumed':
      return trans.__('Running');
    case 'preempted':
      return status.saving ? trans.__('Preempted · saving…') : trans.__('Preempted');
    case 'requeued':
      return [isWaking(status) ? trans.__('Waking') : trans.__('Requeued'), ...place].join(' · ');
    case 'parked':
      if (isParking(status)) {
        return trans.__('Parking · saving…');
      }
      if (!status.gpus) {
        return trans.__('Parked');
      }
      return trans._n('Parked · GPU released', 'Parked · GPUs released', status.gpus);
    case 'failed':
      return failedLabel(status, trans);
    case 'cancelled':
      return trans.__('Cancelled');
    case 'finished':
      return trans.__('Finished');
  }
}

function parseTime(iso: string | null | undefined): number | null {
  if (!iso) {
    return null;
  }
  const ms = Date.parse(iso);
  return Number.isNaN(ms) ? null : ms;
}

/** Options of a `QueueStore`. */
export interface StoreOptions {
  /** An admission after a wait at least this long (ms) deserves a notification. */
  longWaitMs: number;
  /** The clock, in ms since the epoch (tests pass their own). */
  now?: () => number;
  /** The words of labels and notices (English by default). */
  trans?: TranslationBundle;
}

/**
 * Every queued kernel's last known status. Events received before the first listing are held
 * and applied on top of it, so a page load never shows a state older than the server's.
 */
export class QueueStore {
  constructor(options: StoreOptions) {
    this.longWaitMs = options.longWaitMs;
    this._now = options.now ?? Date.now;
    this._trans = options.trans ?? ENGLISH;
  }

  /** Threshold for the "admitted after a long wait" notification, in ms. */
  longWaitMs: number;

  /** True once a listing was loaded. */
  get loaded(): boolean {
    return this._loaded;
  }

  /** Emitted after every change of what the store answers. */
  get changed(): ISignal<this, void> {
    return this._changedSignal;
  }

  /** The entry of one kernel, if it is a queued kernel the store knows. */
  get(kernelId: string): KernelEntry | undefined {
    return this._entries.get(kernelId);
  }

  /** The status-bar text for one kernel, null for kernels that are not queued kernels. */
  label(kernelId: string): string | null {
    const entry = this._entries.get(kernelId);
    return entry ? statusLabel(entry.status, this._trans) : null;
  }

  /** The server's full sentence for one kernel (the status item's tooltip), null if none. */
  sentence(kernelId: string): string | null {
    return this._entries.get(kernelId)?.status.message || null;
  }

  /**
   * Replace everything with the server's listing (a page load, or a reconnect), then apply the
   * events that arrived meanwhile. Returns the notifications those events deserve.
   */
  load(listing: ListingEntry[]): Notice[] {
    this._entries.clear();
    for (const kernel of listing) {
      if (kernel.queue && !FORGOTTEN.has(kernel.queue.state)) {
        const waiting = WAITING.has(kernel.queue.state);
        this._entries.set(kernel.id, {
          status: kernel.queue,
          waitingSince: waiting ? parseTime(kernel.waiting_since) : null,
          waited: null
        });
      }
    }
    return this.resume();
  }

  /**
   * Apply one status event (`at`: its timestamp in ms, default now). Returns the
   * notifications it deserves; none while the first listing is still awaited.
   */
  apply(status: QueueStatus, at?: number): Notice[] {
    const when = at ?? this._now();
    if (!this._loaded) {
      this._held.push([status, when]);
      return [];
    }
    const notices = this._apply(status, when);
    this._changed();
    return notices;
  }

  /**
   * A fresh listing is on its way (the page came back into view, or a periodic check): hold
   * events from now until `load` takes the listing, or `resume` says it could not be had, so
   * that none emitted while the listing is fetched is lost under it.
   */
  hold(): void {
    this._loaded = false;
  }

  /**
   * Apply the held events to what the store has (after `load`, or when the listing could not
   * be fetched) and follow events directly again.
   */
  resume(): Notice[] {
    this._loaded = true;
    const held = this._held;
    this._held = [];
    const notices = held.flatMap(([status, at]) => this._apply(status, at));
    this._changed();
    return notices;
  }

  /** Forget kernels that no longer exist on the server (`ids`: the ones that do). */
  retain(ids: Iterable<string>): void {
    const keep = new Set(ids);
    let changed = false;
    for (const id of [...this._entries.keys()]) {
      if (!keep.has(id)) {
        this._entries.delete(id);
        changed = true;
      }
    }
    if (changed) {
      this._changed();
    }
  }

  /** Forget one kernel (it was shut down). */
  remove(kernelId: string): void {
    if (this._entries.delete(kernelId)) {
      this._changed();
    }
  }

  /** The failed kernels (kept until shut down), each with its label and whole sentence. */
  failed(): FailedRow[] {
    return this.statuses()
      .filter(s => s.state === 'failed')
      .map(s => ({ kernelId: s.kernel_id, label: statusLabel(s, this._trans), message: s.message }))
      .sort((a, b) => a.kernelId.localeCompare(b.kernelId));
  }

  /** Every kernel the store knows, with its last status (the Running sidebar's section). */
  statuses(): QueueStatus[] {
    return [...this._entries.values()].map(entry => entry.status);
  }

  /** The kernels waiting for (re-)admission, by queue then position. */
  queued(): PanelRow[] {
    const now = this._now();
    const rows: PanelRow[] = [];
    for (const [kernelId, entry] of this._entries) {
      const s = entry.status;
      if (!WAITING.has(s.state)) {
        continue;
      }
      rows.push({
        kernelId,
        state: s.state,
        queue: s.queue ?? '',
        position: s.position ?? null,
        queueLength: s.queue_length ?? null,
        gpus: s.gpus ?? 0,
        waited: entry.waitingSince === null ? null : Math.max(0, now - entry.waitingSince)
      });
    }
    const order = (p: number | null) => p ?? Number.MAX_SAFE_INTEGER;
    return rows.sort(
      (a, b) =>
        a.queue.localeCompare(b.queue) ||
        order(a.position) - order(b.position) ||
        a.kernelId.localeCompare(b.kernelId)
    );
  }

  /** The running and parked kernels, each with what its button does, by kernel id. */
  kernels(): KernelRow[] {
    const rows: KernelRow[] = [];
    for (const [kernelId, entry] of this._entries) {
      const s = entry.status;
      if (!LIVE.has(s.state) && s.state !== 'parked') {
        continue;
      }
      const action = s.state === 'parked' ? 'resume' : 'park';
      rows.push({ kernelId, state: s.state, action, message: s.message, gpus: s.gpus ?? 0 });
    }
    return rows.sort((a, b) => a.kernelId.localeCompare(b.kernelId));
  }

  private _apply(status: QueueStatus, at: number): Notice[] {
    const previous = this._entries.get(status.kernel_id);
    if (FORGOTTEN.has(status.state)) {
      this._entries.delete(status.kernel_id);
    } else {
      const waiting = WAITING.has(status.state);
      const wasWaiting = previous !== undefined && WAITING.has(previous.status.state);
      let waitingSince: number | null = null;
      if (waiting) {
        waitingSince = wasWaiting ? previous.waitingSince : at;
      }
      let waited = previous?.waited ?? null;
      if (!waiting && wasWaiting && previous.waitingSince !== null) {
        waited = at - previous.waitingSince;
      }
      this._entries.set(status.kernel_id, { status, waitingSince, waited });
    }
    return this._notices(previous, status);
  }

  private _notices(previous: KernelEntry | undefined, status: QueueStatus): Notice[] {
    const before = previous?.status.state;
    const id = status.kernel_id;
    if (status.state === 'parked') {
      // Once, when it is parked (not while it saves): what was saved, and how it comes back.
      const was = previous !== undefined && before === 'parked' && !isParking(previous.status);
      if (isParking(status) || was) {
        return [];
      }
      return [{ kernelId: id, kind: 'info', moment: 'parked', message: status.message }];
    }
    if (before === status.state) {
      return [];
    }
    switch (status.state) {
      case 'admitted':
      case 'running':
      case 'resumed': {
        const notices: Notice[] = [];
        // Admission ends a wait once: when ADMITTED is skipped, RUNNING/RESUMED ends it.
        const endsWait = before !== undefined && WAITING.has(before);
        const waited = this._entries.get(id)?.waited ?? null;
        if (endsWait && waited !== null && waited >= this.longWaitMs) {
          const trans = this._trans;
          const wait = formatWait(waited, trans);
          const message = status.gpus
            ? trans.__('kernel admitted with %1 after waiting %2', gpuCount(status.gpus, trans), wait)
            : trans.__('kernel admitted after waiting %1', wait);
          notices.push({ kernelId: id, kind: 'success', moment: 'admitted', message });
        }
        if (status.state === 'resumed' && !LIVE.has(before as KernelState)) {
          notices.push({ kernelId: id, kind: 'info', moment: 'resumed', message: status.message });
        }
        return notices;
      }
      case 'preempted':
        return [{ kernelId: id, kind: 'warning', moment: 'preempted', message: status.message }];

      case 'requeued':
        // A preemption seen without the PREEMPTED step (the kernel went straight back).
        if (before !== undefined && LIVE.has(before)) {
          return [{ kernelId: id, kind: 'warning', moment: 'preempted', message: status.message }];
        }
        return [];
      case 'failed':
        return [{ kernelId: id, kind: 'error', moment: 'failed', message: status.message }];
      default:
        return [];
    }
  }

  private _changed(): void {
    this._changedSignal.emit();
  }

  private _entries = new Map<string, KernelEntry>();
  private _held: [QueueStatus, number][] = [];
  private _loaded = false;
  private _changedSignal = new Signal<this, void>(this);
  private _now: () => number;
  private _trans: TranslationBundle;
}
