/**
 * The JupyterLab plugin: shows queued kernels where the user looks.
 *
 * It loads the server's queue listing once (`GET /api/kernel-queue/kernels`), then follows the
 * server's event stream for the kernel-status schema; `state.ts` turns both into labels, panel
 * rows and notices. This module only wires them to the status bar, the panel and JupyterLab's
 * notifications, cancels a queued kernel with the standard `DELETE /api/kernels/{id}`, and parks
 * or resumes one with `POST /api/kernel-queue/kernels/{id}/park|resume`.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { PathExt, URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Event, ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar, Popup, showPopup } from '@jupyterlab/statusbar';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  formatWait,
  gpuCount,
  KernelRow,
  ListingEntry,
  Notice,
  PanelRow,
  QueueStatus,
  QueueStore
} from './state';
import { MachineQueue, MachineView, machineView } from './machine';

const PLUGIN_ID = 'kernel-queue:plugin';
/** The status-event schema (kernel_queue/events.py). */
export const SCHEMA_ID = 'https://events.kernel-queue.dev/kernel-status/v1';
const LISTING_PATH = 'api/kernel-queue/kernels';
const MACHINE_PATH = 'api/kernel-queue/machine';
/** While the panel is open, the machine's queue is fetched again this often (ms). */
const MACHINE_EVERY_MS = 3_000;
/** Default of the `longWaitSeconds` setting (schema/plugin.json). */
const LONG_WAIT_SECONDS = 10;
/**
 * While kernels wait and the page is in view, the listing is fetched again this often (ms):
 * events missed while the events socket was down (JupyterLab reconnects it without telling
 * anyone) are then repaired within this time.
 */
const RESYNC_MS = 30_000;

/** Which notebook a kernel belongs to, for panel rows and notifications. */
function kernelName(app: JupyterFrontEnd, kernelId: string): string {
  for (const session of app.serviceManager.sessions.running()) {
    if (session.kernel?.id === kernelId && session.path) {
      return PathExt.basename(session.path);
    }
  }
  return `kernel ${kernelId.slice(0, 8)}`;
}

async function fetchListing(settings: ServerConnection.ISettings): Promise<ListingEntry[]> {
  const url = URLExt.join(settings.baseUrl, LISTING_PATH);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return (await response.json()) as ListingEntry[];
}

/** The machine's whole local queue: every server's and batch run's kernels of this user. */
async function fetchMachine(settings: ServerConnection.ISettings): Promise<MachineQueue> {
  const url = URLExt.join(settings.baseUrl, MACHINE_PATH);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return (await response.json()) as MachineQueue;
}

/** What a park or resume request answers: the kernel's listing entry, or the refusal. */
async function postAction(
  settings: ServerConnection.ISettings,
  kernelId: string,
  action: 'park' | 'resume'
): Promise<ListingEntry> {
  const url = URLExt.join(settings.baseUrl, LISTING_PATH, kernelId, action);
  const response = await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    // The server's sentence (a 409 says why the kernel cannot be parked).
    throw new Error(body?.message ?? `${response.status} ${response.statusText}`);
  }
  return body as ListingEntry;
}

const ITEM_HINT = 'Kernel queue: click for every queued kernel';

/** The status-bar item: the current notebook's kernel as the queue sees it. */
class QueueStatusItem extends Widget {
  constructor() {
    super({ node: document.createElement('div') });
    this.addClass('jp-KernelQueue-status');
    this.node.title = ITEM_HINT;
    this.node.setAttribute('role', 'button');
    this.node.setAttribute('aria-haspopup', 'dialog');
    this.node.tabIndex = 0;
  }

  /** Fired when the item should appear or disappear. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  get active(): boolean {
    return this._text !== null;
  }

  /** Show `text` (with the server's `sentence` as its tooltip), or hide the item when null. */
  display(text: string | null, kernelId: string | null, sentence: string | null = null): void {
    const was = this.active;
    this._text = text;
    this.node.textContent = text ?? '';
    this.node.title = sentence ? `${sentence}\n(${ITEM_HINT})` : ITEM_HINT;
    this.node.setAttribute('aria-label', sentence ? `${text}: ${sentence}` : (text ?? ''));
    this.node.dataset.kernelId = kernelId ?? '';
    if (was !== this.active) {
      this._activeStateChanged.emit();
    }
  }

  private _text: string | null = null;
  private _activeStateChanged = new Signal<this, void>(this);
}

/** The panel: every kernel waiting in a queue, each with a Cancel button; then the running and
 * parked kernels, each with "Park now" or "Resume". */
class QueuePanel extends Widget {
  constructor(
    private readonly _store: QueueStore,
    private readonly _name: (kernelId: string) => string,
    private readonly _cancel: (kernelId: string) => Promise<void>,
    private readonly _act: (kernelId: string, action: 'park' | 'resume') => Promise<void>,
    private readonly _look: () => Promise<MachineQueue>
  ) {
    super();
    this.addClass('jp-KernelQueue-panel');
    this._unsubscribe = _store.subscribe(() => this.update());
  }

  dispose(): void {
    this._unsubscribe();
    window.clearInterval(this._timer);
    super.dispose();
  }

  protected onAfterAttach(): void {
    this.update();
    // The waits grow while the panel is open.
    this._timer = window.setInterval(() => this.update(), 1000);
    void this._lookAtMachine();
    this._machineTimer = window.setInterval(() => void this._lookAtMachine(), MACHINE_EVERY_MS);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this._timer);
    window.clearInterval(this._machineTimer);
  }

  private async _lookAtMachine(): Promise<void> {
    try {
      this._machine = machineView(await this._look());
    } catch {
      this._machine = null; // an older server, or none: the section is left out
    }
    this.update();
  }

  protected onUpdateRequest(): void {
    // A button being pressed keeps its focus across the redraw (keyboard users stay put).
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.focusKey;
    const node = this.node;
    node.replaceChildren();
    node.appendChild(this._queued());
    const kernels = this._store.kernels();
    if (kernels.length > 0) {
      node.appendChild(this._kernels(kernels));
    }
    if (this._machine !== null) {
      node.appendChild(this._machineSection(this._machine));
    }
    if (focused) {
      node.querySelector<HTMLElement>(`[data-focus-key="${focused}"]`)?.focus();
    }
  }

  private _queued(): HTMLElement {
    const rows = this._store.queued();
    const section = this._section('Queued kernels', 'jp-KernelQueue-queued');
    if (rows.length === 0) {
      const empty = document.createElement('p');
      empty.className = 'jp-KernelQueue-empty';
      empty.textContent = 'No kernel waits in a queue.';
      section.appendChild(empty);
      return section;
    }
    const table = this._table(['Kernel', 'Queue', 'Position', 'Waiting', 'GPUs', 'Action']);
    const body = table.createTBody();
    for (const row of rows) {
      body.appendChild(this._row(row));
    }
    section.appendChild(table);
    return section;
  }

  private _kernels(rows: KernelRow[]): HTMLElement {
    const section = this._section('Running and parked kernels', 'jp-KernelQueue-kernels');
    const table = this._table(['Kernel', 'State', 'GPUs', 'Action']);
    const body = table.createTBody();
    for (const row of rows) {
      const tr = body.insertRow();
      tr.className = 'jp-KernelQueue-kernelRow';
      tr.dataset.kernelId = row.kernelId;
      tr.dataset.state = row.state;
      const name = this._name(row.kernelId);
      const parked = row.action === 'resume';
      for (const text of [name, parked ? 'Parked' : 'Running', gpuCount(row.gpus)]) {
        tr.insertCell().textContent = text;
      }
      tr.cells[1].title = row.message;
      const button = document.createElement('button');
      button.type = 'button';
      button.className = `jp-Button jp-mod-styled ${parked ? 'jp-mod-accept' : 'jp-mod-reject'}`;
      button.classList.add(parked ? 'jp-KernelQueue-resume' : 'jp-KernelQueue-park');
      button.textContent = parked ? 'Resume' : 'Park now';
      button.dataset.focusKey = `${row.action}-${row.kernelId}`;
      button.title = parked
        ? 'Wake this kernel: it waits in its queue, then comes back with its variables'
        : 'Park this kernel now: it saves its variables and gives its GPUs back';
      button.setAttribute('aria-label', `${parked ? 'Resume' : 'Park'} the kernel of ${name}`);
      button.addEventListener('click', () => {
        button.disabled = true;
        button.textContent = parked ? 'Resuming…' : 'Parking…';
        void this._act(row.kernelId, row.action).finally(() => this.update());
      });
      tr.insertCell().appendChild(button);
    }
    section.appendChild(table);
    return section;
  }

  private _machineSection(view: MachineView): HTMLElement {
    const section = this._section('This machine', 'jp-KernelQueue-machine');
    const capacity = document.createElement('p');
    capacity.className = 'jp-KernelQueue-capacity';
    capacity.textContent = view.capacity;
    section.appendChild(capacity);
    if (view.rows.length > 0) {
      const table = this._table(['Elsewhere', 'State', 'GPUs']);
      const body = table.createTBody();
      for (const row of view.rows) {
        const tr = body.insertRow();
        tr.className = 'jp-KernelQueue-machineRow';
        for (const text of [row.who, row.state, row.gpus]) {
          tr.insertCell().textContent = text;
        }
      }
      section.appendChild(table);
    }
    if (view.hidden) {
      const hidden = document.createElement('p');
      hidden.className = 'jp-KernelQueue-hidden';
      hidden.textContent = view.hidden;
      section.appendChild(hidden);
    }
    return section;
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

  private _table(labels: string[]): HTMLTableElement {
    const table = document.createElement('table');
    const head = table.createTHead().insertRow();
    for (const label of labels) {
      const th = document.createElement('th');
      th.scope = 'col';
      th.textContent = label;
      if (label === 'Action') {
        th.className = 'jp-KernelQueue-actionHeader'; // read by screen readers, not shown
      }
      head.appendChild(th);
    }
    return table;
  }

  private static _ids = 0;

  private _row(row: PanelRow): HTMLTableRowElement {
    const tr = document.createElement('tr');
    tr.className = 'jp-KernelQueue-row';
    tr.dataset.kernelId = row.kernelId;
    const position =
      row.position === null
        ? row.state === 'preempted'
          ? 'preempted'
          : '–'
        : `#${row.position}${row.queueLength ? ` of ${row.queueLength}` : ''}`;
    const cells = [
      this._name(row.kernelId),
      row.queue,
      position,
      row.waited === null ? '–' : formatWait(row.waited),
      gpuCount(row.gpus)
    ];
    for (const text of cells) {
      tr.insertCell().textContent = text;
    }
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'jp-Button jp-mod-styled jp-mod-warn jp-KernelQueue-cancel';
    button.textContent = 'Cancel';
    button.title = 'Shut this kernel down and leave the queue';
    button.setAttribute('aria-label', `Cancel the kernel of ${cells[0]}`);
    button.addEventListener('click', () => {
      button.disabled = true;
      button.textContent = 'Cancelling…';
      void this._cancel(row.kernelId);
    });
    tr.insertCell().appendChild(button);
    return tr;
  }

  private _timer = 0;
  private _machineTimer = 0;
  private _machine: MachineView | null = null;
  private _unsubscribe: () => void;
}

function notify(app: JupyterFrontEnd, notice: Notice): void {
  const name = kernelName(app, notice.kernelId);
  const text =
    notice.moment === 'admitted' ? `${name}: kernel ${notice.message}` : `${name}: ${notice.message}`;
  // What happened while the user looked away stays until dismissed; a resume or a park (its
  // item says Parked meanwhile) is a short note.
  const autoClose = notice.moment === 'resumed' || notice.moment === 'parked' ? 10000 : false;
  Notification.emit(text, notice.kind, { autoClose });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Shows a queued kernel’s place, admission, preemption and restore.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const services = app.serviceManager;
    const store = new QueueStore({ longWaitMs: LONG_WAIT_SECONDS * 1000 });
    const show = (notices: Notice[]) => notices.forEach(n => notify(app, n));

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const read = () => {
            const seconds = settings.get('longWaitSeconds').composite as number;
            store.longWaitMs = seconds * 1000;
          };
          read();
          settings.changed.connect(read);
        })
        .catch(reason => console.warn('kernel-queue: settings not loaded', reason));
    }

    // Follow events first, then load the listing: the store holds events until it has it.
    services.events.stream.connect((_, emission: Event.Emission) => {
      if (emission.schema_id === SCHEMA_ID) {
        show(store.apply(emission as unknown as QueueStatus));
      }
    });
    fetchListing(services.serverSettings)
      .then(listing => show(store.load(listing)))
      .catch(reason => {
        console.error('kernel-queue: could not list kernels', reason);
        show(store.load([]));
      });

    // Resync from the listing when the page comes back into view (the events socket may have
    // closed meanwhile and JupyterLab reconnects it only when the page is visible), and now
    // and then while kernels wait.
    let resyncing = false;
    const resync = () => {
      if (resyncing || !store.loaded) {
        return;
      }
      resyncing = true;
      store.hold();
      fetchListing(services.serverSettings)
        .then(listing => show(store.load(listing)))
        .catch(reason => {
          console.warn('kernel-queue: could not refresh the kernel listing', reason);
          show(store.resume());
        })
        .finally(() => (resyncing = false));
    };
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'visible') {
        resync();
      }
    });
    window.setInterval(() => {
      if (document.visibilityState === 'visible' && store.queued().length > 0) {
        resync();
      }
    }, RESYNC_MS);

    // Forget kernels that disappear from the server (shut down from anywhere).
    let known = new Set<string>();
    services.kernels.runningChanged.connect((_, models) => {
      const now = new Set(models.map(m => m.id));
      for (const id of known) {
        if (!now.has(id)) {
          store.remove(id);
        }
      }
      known = now;
    });

    const cancel = async (kernelId: string) => {
      try {
        await services.kernels.shutdown(kernelId);
        store.remove(kernelId);
      } catch (reason) {
        Notification.error(`Could not cancel ${kernelName(app, kernelId)}: ${reason}`);
      }
    };

    const act = async (kernelId: string, action: 'park' | 'resume') => {
      try {
        const entry = await postAction(services.serverSettings, kernelId, action);
        if (entry.queue) {
          show(store.apply(entry.queue));
        }
      } catch (reason) {
        const verb = action === 'park' ? 'park' : 'resume';
        const why = reason instanceof Error ? reason.message : String(reason);
        Notification.error(`Could not ${verb} ${kernelName(app, kernelId)}: ${why}`);
      }
    };

    if (!statusBar) {
      return;
    }
    const item = new QueueStatusItem();
    const currentKernel = (): string | null =>
      tracker.currentWidget?.sessionContext.session?.kernel?.id ?? null;
    const refresh = () => {
      const kernelId = currentKernel();
      let text = kernelId ? store.label(kernelId) : null;
      if (text === null) {
        // Not a queued kernel: still offer the panel while others wait.
        const waiting = store.queued().length;
        text = waiting ? `Queue · ${waiting} waiting` : null;
      }
      item.display(text, kernelId, kernelId ? store.sentence(kernelId) : null);
    };
    store.subscribe(refresh);

    let watched: NotebookPanel | null = null;
    tracker.currentChanged.connect((_, panel) => {
      watched?.sessionContext.kernelChanged.disconnect(refresh);
      watched?.sessionContext.sessionChanged.disconnect(refresh);
      watched = panel;
      panel?.sessionContext.kernelChanged.connect(refresh);
      panel?.sessionContext.sessionChanged.connect(refresh);
      refresh();
    });

    let popup: Popup | null = null;
    const togglePanel = () => {
      if (popup && !popup.isDisposed) {
        popup.dispose();
        popup = null;
        return;
      }
      const look = () => fetchMachine(services.serverSettings);
      const body = new QueuePanel(store, id => kernelName(app, id), cancel, act, look);
      popup = showPopup({ body, anchor: item, align: 'left', hasDynamicSize: true });
    };
    item.node.addEventListener('click', togglePanel);
    item.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        togglePanel();
      }
    });

    statusBar.registerStatusItem('kernel-queue:status', {
      item,
      align: 'left',
      rank: 4,
      isActive: () => item.active,
      activeStateChanged: item.activeStateChanged
    });
  }
};

export default plugin;
