/**
 * The queue panel: each queue's capacity, the kernels holding it (notebook, GPUs, idle time)
 * and those waiting (place, wait), the current notebook's row marked; "Leave queue" for a
 * waiting kernel of this server, "Shut down" and "Park now" for a holder; then the parked
 * kernels with "Resume", and the failed ones with the server's whole sentence (wrapped, never
 * cut off) and "Shut down". Read from `GET /api/kernel-queue/queues` when shown, every few seconds
 * and after each status event; the buttons' requests are the store's (`IKernelQueueStore`).
 */

import type { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { gpuCount } from './look';
import { QueuesListing, QueueRowView, queuesView } from './queues';
import { IKernelQueueStore } from './tokens';

/** While the panel is shown, the queues are read again this often (ms). */
const LOOK_EVERY_MS = 3_000;
/** A burst of status events makes one read, this long after the first (ms). */
const SETTLE_MS = 150;

export class QueuePanel extends Widget {
  /** `current`: the kernel of the notebook in view, if any. */
  constructor(
    private readonly _store: IKernelQueueStore,
    private readonly _current: () => string | null
  ) {
    super();
    this._trans = _store.trans;
    this.addClass('jp-KernelQueue-panel');
    this.node.tabIndex = -1; // focusable, so the keyboard lands in it when it opens
    this.node.setAttribute('aria-label', this._trans.__('Kernel queues'));
    _store.changed.connect(this._soon, this);
  }

  dispose(): void {
    this._store.changed.disconnect(this._soon, this);
    this._stop();
    super.dispose();
  }

  protected onAfterAttach(): void {
    this.update();
    void this._look();
    this._clock = window.setInterval(() => this.update(), 1000); // waits and idle times grow
    this._poll = window.setInterval(() => void this._look(), LOOK_EVERY_MS);
  }

  protected onBeforeDetach(): void {
    this._stop();
  }

  private _stop(): void {
    window.clearInterval(this._clock);
    window.clearInterval(this._poll);
    window.clearTimeout(this._settle);
  }

  private _soon(): void {
    if (!this.isAttached || this._settle) {
      return;
    }
    this._settle = window.setTimeout(() => {
      this._settle = 0;
      void this._look();
    }, SETTLE_MS);
  }

  private async _look(): Promise<void> {
    try {
      this._listing = await this._store.queues();
      this._error = '';
    } catch (reason) {
      const why = reason instanceof Error ? reason.message : String(reason);
      this._error = this._trans.__('Could not read the queues: %1', why);
    }
    this.update();
  }

  protected onUpdateRequest(): void {
    // A focused button keeps its focus across the redraw (keyboard users stay put); focus on
    // a button that is gone stays in the panel, so Escape still reaches its popup or dialog.
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.focusKey;
    const node = this.node;
    const inside = node.contains(document.activeElement);
    node.replaceChildren();
    node.appendChild(this._queues());
    const trans = this._trans;
    const parked = this._store.kernels().filter(row => row.action === 'resume');
    if (parked.length > 0) {
      const section = this._section(trans.__('Parked kernels'), 'jp-KernelQueue-parked');
      const table = this._table();
      for (const row of parked) {
        const tr = table.tBodies[0].insertRow();
        tr.className = 'jp-KernelQueue-parkedRow';
        tr.dataset.kernelId = row.kernelId;
        const name = this._store.name(row.kernelId);
        this._cells(tr, [name, trans.__('parked'), gpuCount(row.gpus, trans)], row.message);
        const cell = tr.insertCell();
        cell.appendChild(this._resume(row.kernelId, name));
        cell.appendChild(this._shutdown(row.kernelId, name, 'holder'));
      }
      section.appendChild(table);
      node.appendChild(section);
    }
    const failed = this._store.failed();
    if (failed.length > 0) {
      const section = this._section(trans.__('Failed kernels'), 'jp-KernelQueue-failed');
      for (const row of failed) {
        const name = this._store.name(row.kernelId);
        const block = document.createElement('div');
        block.className = 'jp-KernelQueue-failure';
        block.dataset.kernelId = row.kernelId;
        const heading = document.createElement('h4');
        heading.textContent = trans.__('%1: %2', name, row.label);
        const reason = document.createElement('p');
        reason.className = 'jp-KernelQueue-reason';
        reason.textContent = row.message;
        block.append(heading, reason, this._shutdown(row.kernelId, name, 'failed'));
        section.appendChild(block);
      }
      node.appendChild(section);
    }
    const again = focused ? node.querySelector<HTMLElement>(`[data-focus-key="${focused}"]`) : null;
    if (again) {
      again.focus();
    } else if (inside && !node.contains(document.activeElement)) {
      node.focus();
    }
  }

  private _queues(): HTMLElement {
    const trans = this._trans;
    const section = this._section(trans.__('Queues'), 'jp-KernelQueue-queues');
    const say = (text: string, className: string) => {
      const p = document.createElement('p');
      p.className = className;
      p.textContent = text;
      section.appendChild(p);
    };
    if (this._error) {
      say(this._error, 'jp-KernelQueue-error');
    }
    if (this._listing === null) {
      say(this._error ? '' : trans.__('Reading the queues…'), 'jp-KernelQueue-empty');
      return section;
    }
    const view = queuesView(
      this._listing,
      this._current(),
      id => this._store.name(id),
      Date.now(),
      trans
    );
    if (view.shared) {
      say(view.shared, 'jp-KernelQueue-capacity');
    }
    if (view.queues.length === 0) {
      say(trans.__('No kernel holds or waits in a queue.'), 'jp-KernelQueue-empty');
    }
    for (const queue of view.queues) {
      const block = document.createElement('div');
      block.className = 'jp-KernelQueue-queue';
      block.dataset.queue = queue.name;
      const heading = document.createElement('h4');
      heading.textContent = queue.capacity
        ? trans.__('%1: %2', queue.name, queue.capacity)
        : queue.name;
      block.appendChild(heading);
      if (queue.error) {
        const error = document.createElement('p');
        error.className = 'jp-KernelQueue-queueError';
        error.textContent = queue.error;
        block.appendChild(error);
      }
      if (queue.rows.length === 0) {
        const empty = document.createElement('p');
        empty.className = 'jp-KernelQueue-empty';
        empty.textContent = trans.__('Nobody holds or waits in this queue.');
        block.appendChild(empty);
      } else {
        const table = this._table();
        for (const row of queue.rows) {
          table.tBodies[0].appendChild(this._row(row));
        }
        block.appendChild(table);
      }
      section.appendChild(block);
    }
    if (view.hidden) {
      say(view.hidden, 'jp-KernelQueue-hidden');
    }
    return section;
  }

  private _row(row: QueueRowView): HTMLTableRowElement {
    const tr = document.createElement('tr');
    tr.className = 'jp-KernelQueue-queueRow';
    tr.dataset.kernelId = row.kernelId;
    tr.dataset.role = row.role;
    if (row.current) {
      tr.classList.add('jp-mod-current');
      tr.setAttribute('aria-current', 'true');
    }
    this._cells(tr, [row.who, row.state, row.gpus], row.title);
    if (row.current) {
      const mark = document.createElement('span');
      mark.className = 'jp-KernelQueue-thisNotebook';
      mark.textContent = this._trans.__('this notebook');
      tr.cells[0].appendChild(mark);
    }
    const cell = tr.insertCell();
    if (row.action === 'leave') {
      cell.appendChild(this._shutdown(row.kernelId, row.who, 'waiting'));
    } else if (row.action === 'shutdown') {
      if (this._store.kernels().some(k => k.kernelId === row.kernelId && k.action === 'park')) {
        cell.appendChild(this._park(row.kernelId, row.who));
      }
      cell.appendChild(this._shutdown(row.kernelId, row.who, 'holder'));
    }
    return tr;
  }

  private _cells(tr: HTMLTableRowElement, texts: string[], title: string): void {
    for (const text of texts) {
      tr.insertCell().textContent = text;
    }
    if (title) {
      tr.cells[1].title = title;
    }
  }

  private _button(key: string, text: string, label: string, hint: string, kind: string) {
    const button = document.createElement('button');
    button.type = 'button';
    button.className = `jp-Button jp-mod-styled ${kind} jp-KernelQueue-action`;
    button.textContent = text;
    button.title = hint;
    button.setAttribute('aria-label', label);
    button.dataset.focusKey = key;
    // A pressed button is disabled (and so loses focus): the panel keeps it.
    button.addEventListener('click', () => this.node.focus());
    return button;
  }

  /** "Leave queue" for a waiting kernel, "Shut down" for a holder or a failed kernel: each
   * shuts it down. */
  private _shutdown(kernelId: string, name: string, role: 'waiting' | 'holder' | 'failed') {
    const trans = this._trans;
    const leaving = role === 'waiting';
    const button = role === 'failed'
      ? this._button(
          `shutdown-${kernelId}`,
          trans.__('Shut down'),
          trans.__('Shut down the failed kernel of %1', name),
          trans.__('Shut this failed kernel down'),
          'jp-mod-reject'
        )
      : leaving
      ? this._button(
          `leave-${kernelId}`,
          trans.__('Leave queue'),
          trans.__('Leave the queue: shut down the waiting kernel of %1', name),
          trans.__('Shut this waiting kernel down: it leaves the queue'),
          'jp-mod-warn'
        )
      : this._button(
          `shutdown-${kernelId}`,
          trans.__('Shut down'),
          trans.__('Shut down the kernel of %1', name),
          trans.__('Shut this kernel down: its GPUs go to the next in line, its variables are lost'),
          'jp-mod-reject'
        );
    button.addEventListener('click', () => {
      button.disabled = true;
      button.textContent = leaving ? trans.__('Leaving…') : trans.__('Shutting down…');
      void this._store.shutdown(kernelId).finally(() => void this._look());
    });
    return button;
  }

  private _park(kernelId: string, name: string) {
    const trans = this._trans;
    const button = this._button(
      `park-${kernelId}`,
      trans.__('Park now'),
      trans.__('Park the kernel of %1', name),
      trans.__('Park this kernel now: it saves its variables and gives its GPUs back'),
      'jp-mod-accept'
    );
    button.addEventListener('click', () => {
      button.disabled = true;
      button.textContent = trans.__('Parking…');
      void this._store.park(kernelId, 'park').finally(() => this.update());
    });
    return button;
  }

  private _resume(kernelId: string, name: string) {
    const trans = this._trans;
    const button = this._button(
      `resume-${kernelId}`,
      trans.__('Resume'),
      trans.__('Resume the kernel of %1', name),
      trans.__('Wake this kernel: it waits in its queue, then comes back with its variables'),
      'jp-mod-accept'
    );
    button.addEventListener('click', () => {
      button.disabled = true;
      button.textContent = trans.__('Resuming…');
      void this._store.park(kernelId, 'resume').finally(() => this.update());
    });
    return button;
  }

  private _section(title: string, className: string): HTMLElement {
    const section = document.createElement('section');
    section.className = className;
    const heading = document.createElement('h3');
    heading.textContent = title;
    heading.id = `${className}-${++QueuePanel._ids}`;
    section.setAttribute('aria-labelledby', heading.id);
    section.appendChild(heading);
    return section;
  }

  /** A table of kernels: Kernel, State, GPUs and (for screen readers only) Actions. */
  private _table(): HTMLTableElement {
    const trans = this._trans;
    const table = document.createElement('table');
    const head = table.createTHead().insertRow();
    const labels = [trans.__('Kernel'), trans.__('State'), trans.__('GPUs'), trans.__('Actions')];
    for (const [i, label] of labels.entries()) {
      const th = document.createElement('th');
      th.scope = 'col';
      th.textContent = label;
      if (i === labels.length - 1) {
        th.className = 'jp-KernelQueue-actionHeader'; // read by screen readers, not shown
      }
      head.appendChild(th);
    }
    table.createTBody();
    return table;
  }

  private static _ids = 0;
  private _listing: QueuesListing | null = null;
  private _error = '';
  private _clock = 0;
  private _poll = 0;
  private _settle = 0;
  private _trans: TranslationBundle;
}
