/**
 * The JupyterLab extension: queued kernels shown where the user looks, as five plugins.
 *
 * `kernel-queue:store` provides `IKernelQueueStore` (`store.ts`): the server's queue listing
 * and status events, turned into labels, tones and notifications (`state.ts`, `look.ts`). Each
 * of the others requires it and can be turned off on its own: `kernel-queue:status-bar` (the
 * current notebook's kernel as the queue sees it, a click opens the queue panel),
 * `kernel-queue:toolbar` (each notebook's indicator beside the kernel's name),
 * `kernel-queue:running` (the Running sidebar's "Kernel Queue" section, `running.ts`) and
 * `kernel-queue:panel` (the "Kernel Queue: Show queues" command's dialog, `panel.ts`). Every
 * string goes through `ITranslator` (domain `kernel_queue`).
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IRunningSessionManagers } from '@jupyterlab/running';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar, Popup, showPopup } from '@jupyterlab/statusbar';
import { ITranslator } from '@jupyterlab/translation';

import { bundle, indicatorText, toneOf } from './look';
import { QueuePanel } from './panel';
import { QueueSessions } from './running';
import { estimateOf } from './state';
import { KernelQueue } from './store';
import { IKernelQueueStore } from './tokens';
import { ICONS, QueueStatusItem, WaitingIndicator } from './widgets';

export { IKernelQueueStore, IQueueState } from './tokens';
export { SCHEMA_ID } from './store';

/** The store's plugin id: its settings are schema/store.json. */
const STORE_ID = 'kernel-queue:store';
const SHOW_COMMAND = 'kernel-queue:show';

const kernelOf = (panel: NotebookPanel | null): string | null =>
  panel?.sessionContext.session?.kernel?.id ?? null;

const store: JupyterFrontEndPlugin<IKernelQueueStore> = {
  id: STORE_ID,
  description: 'Follows this server’s queued kernels: their places, admissions and failures.',
  autoStart: true,
  provides: IKernelQueueStore,
  optional: [ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ): IKernelQueueStore => {
    const queue = new KernelQueue(app.serviceManager, bundle(translator));
    settingRegistry
      ?.load(STORE_ID)
      .then(settings => {
        const read = () => {
          queue.longWaitSeconds = settings.get('longWaitSeconds').composite as number;
        };
        read();
        settings.changed.connect(read);
      })
      .catch(reason => console.warn('kernel-queue: settings not loaded', reason));
    queue.start();
    return queue;
  }
};

const panel: JupyterFrontEndPlugin<void> = {
  id: 'kernel-queue:panel',
  description: 'The queues in a dialog, from the “Kernel Queue: Show queues” command.',
  autoStart: true,
  requires: [IKernelQueueStore, INotebookTracker],
  optional: [ICommandPalette, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    queue: IKernelQueueStore,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    translator: ITranslator | null
  ) => {
    const trans = bundle(translator);
    app.commands.addCommand(SHOW_COMMAND, {
      label: trans.__('Kernel Queue: Show queues'),
      caption: trans.__('Each queue’s GPUs, who holds them and who waits'),
      execute: async () => {
        const body = new QueuePanel(queue, () => kernelOf(tracker.currentWidget));
        await showDialog({
          title: trans.__('Kernel queues'),
          body,
          buttons: [Dialog.okButton({ label: trans.__('Close') })]
        });
        body.dispose();
      }
    });
    palette?.addItem({ command: SHOW_COMMAND, category: trans.__('Kernel') });
  }
};

const toolbar: JupyterFrontEndPlugin<void> = {
  id: 'kernel-queue:toolbar',
  description: 'Each notebook’s toolbar says, beside the kernel’s name, what its kernel waits for.',
  autoStart: true,
  requires: [IKernelQueueStore, INotebookTracker],
  optional: [ITranslator],
  activate: (
    app: JupyterFrontEnd,
    queue: IKernelQueueStore,
    tracker: INotebookTracker,
    translator: ITranslator | null
  ) => {
    const trans = bundle(translator);
    tracker.widgetAdded.connect((_, notebook) => {
      const indicator = new WaitingIndicator();
      if (!notebook.toolbar.insertAfter('kernelName', 'kernelQueue', indicator)) {
        notebook.toolbar.addItem('kernelQueue', indicator);
      }
      const refresh = () => {
        const kernelId = kernelOf(notebook);
        const status = kernelId ? queue.get(kernelId)?.status : undefined;
        const label = kernelId ? queue.label(kernelId) : null;
        const text =
          status && label ? indicatorText(status, label, estimateOf(status, trans), trans) : null;
        indicator.display(text, status ? toneOf(status) : 'running', status?.message ?? null);
      };
      queue.changed.connect(refresh);
      notebook.sessionContext.kernelChanged.connect(refresh);
      notebook.disposed.connect(() => queue.changed.disconnect(refresh));
      refresh();
    });
  }
};

const running: JupyterFrontEndPlugin<void> = {
  id: 'kernel-queue:running',
  description: 'A “Kernel Queue” section in the Running sidebar: the kernels that wait, start, are parked or failed.',
  autoStart: true,
  requires: [IKernelQueueStore, IRunningSessionManagers, INotebookTracker],
  optional: [ITranslator],
  activate: (
    app: JupyterFrontEnd,
    queue: IKernelQueueStore,
    managers: IRunningSessionManagers,
    tracker: INotebookTracker,
    translator: ITranslator | null
  ) => {
    // A click shows the kernel's notebook if it is open, else the queues; the refresh button
    // reads the listing again.
    const section = new QueueSessions(queue, {
      name: id => queue.name(id),
      icons: ICONS,
      open: kernelId => {
        const notebook = tracker.find(p => kernelOf(p) === kernelId);
        if (notebook) {
          app.shell.activateById(notebook.id);
        } else if (app.commands.hasCommand(SHOW_COMMAND)) {
          void app.commands.execute(SHOW_COMMAND);
        }
      },
      shutdown: id => queue.shutdown(id),
      refresh: () => queue.refresh(),
      trans: bundle(translator)
    });
    app.serviceManager.sessions.runningChanged.connect(() => section.changed()); // names
    managers.add(section);
  }
};

const statusBar: JupyterFrontEndPlugin<void> = {
  id: 'kernel-queue:status-bar',
  description: 'The status bar shows the current notebook’s kernel as the queue sees it.',
  autoStart: true,
  requires: [IKernelQueueStore, IStatusBar, INotebookTracker],
  optional: [ITranslator],
  activate: (
    app: JupyterFrontEnd,
    queue: IKernelQueueStore,
    bar: IStatusBar,
    tracker: INotebookTracker,
    translator: ITranslator | null
  ) => {
    const trans = bundle(translator);
    const item = new QueueStatusItem(trans);
    const refresh = () => {
      const kernelId = kernelOf(tracker.currentWidget);
      const status = kernelId ? queue.get(kernelId)?.status : undefined;
      const waiting = queue.queued().length;
      if (status && toneOf(status) !== 'running') {
        const label = queue.label(status.kernel_id);
        item.display(label, toneOf(status), kernelId, status.message, status.state);
      } else {
        // Running (JupyterLab's own status says so), or not a queued kernel: the item only
        // offers the panel while kernels wait.
        const text = waiting ? trans.__('Queue · %1 waiting', waiting) : null;
        item.display(text, null, kernelId, status?.message ?? null, status?.state ?? '');
      }
    };
    queue.changed.connect(refresh);

    let watched: NotebookPanel | null = null;
    tracker.currentChanged.connect((_, current) => {
      watched?.sessionContext.kernelChanged.disconnect(refresh);
      watched?.sessionContext.sessionChanged.disconnect(refresh);
      watched = current;
      current?.sessionContext.kernelChanged.connect(refresh);
      current?.sessionContext.sessionChanged.connect(refresh);
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
      const body = new QueuePanel(queue, () => kernelOf(tracker.currentWidget));
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

    bar.registerStatusItem('kernel-queue:status', {
      item,
      align: 'left',
      rank: 4,
      isActive: () => item.active,
      activeStateChanged: item.activeStateChanged
    });
  }
};

const plugins: JupyterFrontEndPlugin<any>[] = [store, statusBar, toolbar, running, panel];
export default plugins;
