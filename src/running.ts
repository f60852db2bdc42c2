/**
 * The Running sidebar's "Kernel Queue" section: this server's queued kernels that cannot run
 * cells (waiting, admitted and starting, preempted or requeued, parked, failed), each with its
 * state's icon, short label and the server's whole sentence as tooltip. Running kernels are left
 * to JupyterLab's own Kernels section. Read from the store only (no requests of its own);
 * names, icons, opening and shutting down are the `kernel-queue:running` plugin's.
 */

import type { IRunningSessions } from '@jupyterlab/running';
import type { TranslationBundle } from '@jupyterlab/translation';
import type { LabIcon } from '@jupyterlab/ui-components';
import { ISignal, Signal } from '@lumino/signaling';

import { ENGLISH, Tone, toneOf } from './look';
import { LIVE, QueueStatus, statusLabel, TERMINAL, WAITING } from './state';
import type { IQueueState } from './tokens';

/** The section's title in the Running sidebar (in English: the translation is the plugin's). */
export const SECTION_NAME = 'Kernel Queue';

/** One item of the section, as plain data. */
export interface SidebarItem {
  kernelId: string;
  /** The notebook's name (or "kernel 1a2b3c4d" without one). */
  name: string;
  tone: Tone;
  /** The short label, as the status-bar item says it: "Queued · #1 in gpu". */
  detail: string;
  /** The server's whole sentence, the item's tooltip. */
  title: string;
  /** Shutting a waiting kernel down is leaving its queue. */
  waiting: boolean;
  /** What the item's shutdown button says (its tooltip and accessible name). */
  shutdownLabel: string;
}

/** Starting kernels first, then those waiting (by queue and place), parked, failed. */
function rank(status: QueueStatus): number {
  if (status.state === 'admitted') {
    return 0;
  }
  if (WAITING.has(status.state)) {
    return 1;
  }
  return status.state === 'parked' ? 2 : 3;
}

/** Whether the section lists a kernel in this state: not a running one, nor one that ended
 * (except a failed one, kept until it is shut down, as the status item keeps it). */
export function listed(status: QueueStatus): boolean {
  return !LIVE.has(status.state) && (!TERMINAL.has(status.state) || status.state === 'failed');
}

/** The section's items from the store's statuses; `name` names a kernel by its notebook. */
export function sidebarItems(
  statuses: QueueStatus[],
  name: (kernelId: string) => string,
  trans: TranslationBundle = ENGLISH
): SidebarItem[] {
  const place = (s: QueueStatus) => s.position ?? Number.MAX_SAFE_INTEGER;
  return statuses
    .filter(listed)
    .sort(
      (a, b) =>
        rank(a) - rank(b) ||
        (a.queue ?? '').localeCompare(b.queue ?? '') ||
        place(a) - place(b) ||
        a.kernel_id.localeCompare(b.kernel_id)
    )
    .map(status => {
      const who = name(status.kernel_id);
      const waiting = WAITING.has(status.state);
      return {
        kernelId: status.kernel_id,
        name: who,
        tone: toneOf(status),
        detail: statusLabel(status, trans),
        title: status.message || statusLabel(status, trans),
        waiting,
        shutdownLabel: waiting
          ? trans.__('Leave the queue: shut down the waiting kernel of %1', who)
          : trans.__('Shut down the kernel of %1', who)
      };
    });
}

/** The body of JupyterLab's "Shut Down All?" dialog for the section's items. */
export function shutdownAllText(
  items: SidebarItem[],
  trans: TranslationBundle = ENGLISH,
  section: string = SECTION_NAME
): string {
  const waiting = items.some(item => item.waiting);
  const question = trans._n(
    'Shut down the %1 kernel listed under %2?',
    'Shut down all %1 kernels listed under %2?',
    items.length,
    section
  );
  const lost = waiting
    ? trans.__('Waiting kernels leave their queue; any variables are lost.')
    : trans.__('Any variables are lost.');
  return `${question} ${lost}`;
}

/** What the section asks of the plugin. */
export interface SectionActions {
  /** A kernel's name: its notebook, else "kernel 1a2b3c4d". */
  name(kernelId: string): string;
  /** The icon of each tone (widgets.ts's `ICONS`). */
  icons: Record<Tone, LabIcon>;
  /** The item was clicked: show the kernel's notebook, or the queues. */
  open(kernelId: string): void;
  /** Shut the kernel down (`DELETE /api/kernels/{id}`; for a waiting one, leaving its queue). */
  shutdown(kernelId: string): Promise<void>;
  /** The sidebar's refresh button: read the server's listing again. */
  refresh(): void;
  /** The words (English by default). */
  trans?: TranslationBundle;
}

type Item = IRunningSessions.IRunningItem & { readonly item: SidebarItem };

/** The section's manager, registered with `IRunningSessionManagers`. */
export class QueueSessions implements IRunningSessions.IManager {
  constructor(
    private readonly _store: IQueueState,
    private readonly _actions: SectionActions
  ) {
    this._trans = _actions.trans ?? ENGLISH;
    this.name = this._trans.__('Kernel Queue');
    _store.changed.connect(this.changed, this);
  }

  readonly name: string;

  get runningChanged(): ISignal<this, void> {
    return this._runningChanged;
  }

  /** The items as plain data (what `running()` shows). */
  items(): SidebarItem[] {
    return sidebarItems(this._store.statuses(), id => this._actions.name(id), this._trans);
  }

  running(): IRunningSessions.IRunningItem[] {
    return this.items().map(
      (item): Item => ({
        item,
        className: `jp-KernelQueue-runningItem jp-KernelQueue-running-${item.tone}`,
        context: item.kernelId,
        icon: () => this._actions.icons[item.tone],
        label: () => item.name,
        labelTitle: () => item.title,
        detail: () => item.detail,
        open: () => this._actions.open(item.kernelId),
        shutdown: () => void this._actions.shutdown(item.kernelId)
      })
    );
  }

  shutdownLabel = (running: IRunningSessions.IRunningItem): string =>
    (running as Item).item?.shutdownLabel ?? this._trans.__('Shut Down');

  shutdownAllConfirmationText = (): string =>
    shutdownAllText(this.items(), this._trans, this.name);

  shutdownAll(): void {
    for (const item of this.items()) {
      void this._actions.shutdown(item.kernelId);
    }
  }

  refreshRunning(): void {
    this._actions.refresh();
  }

  /** Something the items show changed (the store, or a notebook's name). */
  changed(): void {
    this._runningChanged.emit();
  }

  dispose(): void {
    this._store.changed.disconnect(this.changed, this);
    Signal.clearData(this);
  }

  private _runningChanged = new Signal<this, void>(this);
  private _trans: TranslationBundle;
}
