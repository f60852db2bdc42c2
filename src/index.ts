/**
 * The JupyterLab plugin: shows queued kernels where the user looks.
 *
 * It loads the server's queue listing once (`GET /api/kernel-queue/kernels`), then follows the
 * server's event stream for the kernel-status schema; `state.ts` and `look.ts` turn both into
 * labels, tones and notices. This module only wires them to the status-bar item and each
 * notebook's toolbar indicator (`widgets.ts`), the queue panel (`panel.ts`, from
 * `GET /api/kernel-queue/queues`, as a status-bar popup or the "Kernel Queue: Show queues"
 * command's dialog) and JupyterLab's notifications; it shuts kernels down with the standard
 * `DELETE /api/kernels/{id}`, and parks or resumes one with
 * `POST /api/kernel-queue/kernels/{id}/park|resume`. The Running sidebar, where present, gets a
 * "Kernel Queue" section (`running.ts`) of the kernels that wait, start, are parked or failed.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ICommandPalette, Notification, showDialog } from '@jupyterlab/apputils';
import { PathExt, URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IRunningSessionManagers } from '@jupyterlab/running';
import { Event, ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar, Popup, showPopup } from '@jupyterlab/statusbar';

import { indicatorText, namedKernels, toneOf } from './look';
import { QueuePanel } from './panel';
import { QueuesListing } from './queues';
import { QueueSessions } from './running';
import { ListingEntry, Notice, QueueStatus, QueueStore } from './state';
import { ICONS, QueueStatusItem, WaitingIndicator } from './widgets';

const PLUGIN_ID = 'kernel-queue:plugin';
/** The status-event schema (kernel_queue/events.py). */
export const SCHEMA_ID = 'https://events.kernel-queue.dev/kernel-status/v1';
const LISTING_PATH = 'api/kernel-queue/kernels';
const QUEUES_PATH = 'api/kernel-queue/queues';
const SHOW_COMMAND = 'kernel-queue:show';
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

/** Each queue's capacity, holders and waiting list (with the machine's other kernels). */
async function fetchQueues(settings: ServerConnection.ISettings): Promise<QueuesListing> {
  const url = URLExt.join(settings.baseUrl, QUEUES_PATH);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return (await response.json()) as QueuesListing;
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

/** A session's path until JupyterLab gives it the document's (a new session's, a moment). */
const PROVISIONAL_PATH = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** The notebook open here whose kernel's id starts with these eight hex digits, if any. */
function notebookOf(app: JupyterFrontEnd, shortId: string): string | null {
  for (const session of app.serviceManager.sessions.running()) {
    const id = session.kernel?.id.replace(/-/g, '');
    const name = session.path ? PathExt.basename(session.path) : '';
    if (id?.startsWith(shortId) && name && !PROVISIONAL_PATH.test(name)) {
      return name;
    }
  }
  return null;
}

function notify(app: JupyterFrontEnd, notice: Notice): void {
  const name = kernelName(app, notice.kernelId);
  // The preemptor, say, named by its notebook where it is one of this user's (the kernel the
  // notice is about is already named first).
  const own = notice.kernelId.replace(/-/g, '').slice(0, 8);
  const message = namedKernels(notice.message, id => (id === own ? null : notebookOf(app, id)));
  const text = notice.moment === 'admitted' ? `${name}: kernel ${message}` : `${name}: ${message}`;
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
  optional: [IStatusBar, ISettingRegistry, ICommandPalette, IRunningSessionManagers],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    palette: ICommandPalette | null,
    runningManagers: IRunningSessionManagers | null
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

    const shutdown = async (kernelId: string) => {
      try {
        await services.kernels.shutdown(kernelId);
        store.remove(kernelId);
      } catch (reason) {
        Notification.error(`Could not shut down ${kernelName(app, kernelId)}: ${reason}`);
      }
    };

    const park = async (kernelId: string, action: 'park' | 'resume') => {
      try {
        const entry = await postAction(services.serverSettings, kernelId, action);
        if (entry.queue) {
          show(store.apply(entry.queue));
        }
      } catch (reason) {
        const why = reason instanceof Error ? reason.message : String(reason);
        Notification.error(`Could not ${action} ${kernelName(app, kernelId)}: ${why}`);
      }
    };

    const kernelOf = (panel: NotebookPanel | null): string | null =>
      panel?.sessionContext.session?.kernel?.id ?? null;
    const newPanel = () =>
      new QueuePanel(store, {
        look: () => fetchQueues(services.serverSettings),
        current: () => kernelOf(tracker.currentWidget),
        name: id => kernelName(app, id),
        shutdown,
        park
      });

    // Each notebook's toolbar says, beside the kernel's name, what its kernel waits for.
    tracker.widgetAdded.connect((_, panel) => {
      const indicator = new WaitingIndicator();
      if (!panel.toolbar.insertAfter('kernelName', 'kernelQueue', indicator)) {
        panel.toolbar.addItem('kernelQueue', indicator);
      }
      const refresh = () => {
        const kernelId = kernelOf(panel);
        const status = kernelId ? store.get(kernelId)?.status : undefined;
        const label = kernelId ? store.label(kernelId) : null;
        const text = status && label ? indicatorText(status, label) : null;
        indicator.display(text, status ? toneOf(status) : 'running', status?.message ?? null);
      };
      const unsubscribe = store.subscribe(refresh);
      panel.sessionContext.kernelChanged.connect(refresh);
      panel.disposed.connect(unsubscribe);
      refresh();
    });

    // The queues in a dialog, from the command palette (and wherever the command is offered).
    app.commands.addCommand(SHOW_COMMAND, {
      label: 'Kernel Queue: Show queues',
      caption: 'Each queue’s GPUs, who holds them and who waits',
      execute: async () => {
        const body = newPanel();
        await showDialog({
          title: 'Kernel queues',
          body,
          buttons: [Dialog.okButton({ label: 'Close' })]
        });
        body.dispose();
      }
    });
    palette?.addItem({ command: SHOW_COMMAND, category: 'Kernel' });

    // The Running sidebar's section: a click shows the kernel's notebook if it is open, else
    // the queues; its refresh button reads the listing again.
    if (runningManagers) {
      const section = new QueueSessions(store, {
        name: id => kernelName(app, id),
        icons: ICONS,
        open: kernelId => {
          const panel = tracker.find(p => kernelOf(p) === kernelId);
          if (panel) {
            app.shell.activateById(panel.id);
          } else {
            void app.commands.execute(SHOW_COMMAND);
          }
        },
        shutdown,
        refresh: resync
      });
      services.sessions.runningChanged.connect(() => section.changed()); // notebook names
      runningManagers.add(section);
    }

    if (!statusBar) {
      return;
    }
    const item = new QueueStatusItem();
    const refresh = () => {
      const kernelId = kernelOf(tracker.currentWidget);
      const status = kernelId ? store.get(kernelId)?.status : undefined;
      const waiting = store.queued().length;
      if (status && toneOf(status) !== 'running') {
        item.display(store.label(status.kernel_id), toneOf(status), kernelId, status.message, status.state);
      } else {
        // Running (JupyterLab's own status says so), or not a queued kernel: the item only
        // offers the panel while kernels wait.
        const text = waiting ? `Queue · ${waiting} waiting` : null;
        item.display(text, null, kernelId, status?.message ?? null, status?.state ?? '');
      }
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
    const closePanel = () => {
      document.removeEventListener('keydown', onEscape, true);
      popup?.dispose();
      popup = null;
    };
    const onEscape = (event: KeyboardEvent) => {
      if (event.key === 'Escape' && popup) {
        event.preventDefault();
        event.stopPropagation();
        closePanel();
        item.node.focus();
      }
    };
    const togglePanel = () => {
      if (popup && !popup.isDisposed) {
        closePanel();
        return;
      }
      const body = newPanel();
      popup = showPopup({ body, anchor: item, align: 'left', hasDynamicSize: true });
      popup.disposed.connect(() => document.removeEventListener('keydown', onEscape, true));
      document.addEventListener('keydown', onEscape, true);
      body.node.focus();
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
