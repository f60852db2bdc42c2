/**
 * The kernel queue store as JupyterLab's service (`IKernelQueueStore`): it loads the server's
 * queue listing once (`GET /api/kernel-queue/kernels`), then follows the server's event stream
 * for the kernel-status schema, reads the listing again when the page comes back into view and
 * now and then while kernels wait, and forgets kernels that disappear from the server. What it
 * learns goes to a `QueueStore` (`state.ts`); the notifications a change deserves go to
 * JupyterLab's. It shuts kernels down with the standard `DELETE /api/kernels/{id}`, and parks or
 * resumes one with `POST /api/kernel-queue/kernels/{id}/park|resume`.
 */

import { Notification } from '@jupyterlab/apputils';
import { PathExt, URLExt } from '@jupyterlab/coreutils';
import { Event, ServerConnection, ServiceManager } from '@jupyterlab/services';
import type { TranslationBundle } from '@jupyterlab/translation';
import { ISignal, Signal } from '@lumino/signaling';

import { namedKernels } from './look';
import { QueuesListing } from './queues';
import { KernelEntry, ListingEntry, Notice, QueueStatus, QueueStore } from './state';
import { IKernelQueueStore } from './tokens';

/** The status-event schema (kernel_queue/events.py). */
export const SCHEMA_ID = 'https://events.kernel-queue.dev/kernel-status/v1';
const LISTING_PATH = 'api/kernel-queue/kernels';
const QUEUES_PATH = 'api/kernel-queue/queues';
/** Default of the `longWaitSeconds` setting (schema/store.json). */
export const LONG_WAIT_SECONDS = 10;
/**
 * While kernels wait and the page is in view, the listing is fetched again this often (ms):
 * events missed while the events socket was down (JupyterLab reconnects it without telling
 * anyone) are then repaired within this time.
 */
const RESYNC_MS = 30_000;
/** A session's path until JupyterLab gives it the document's (a new session's, a moment). */
const PROVISIONAL_PATH = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

async function getJson<T>(settings: ServerConnection.ISettings, path: string): Promise<T> {
  const url = URLExt.join(settings.baseUrl, path);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return (await response.json()) as T;
}

/** The store behind `IKernelQueueStore`. */
export class KernelQueue implements IKernelQueueStore {
  constructor(
    private readonly _services: ServiceManager.IManager,
    readonly trans: TranslationBundle
  ) {
    this._store = new QueueStore({ longWaitMs: LONG_WAIT_SECONDS * 1000, trans });
    this._store.changed.connect(() => this._changed.emit(), this);
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** An admission after a wait at least this long (seconds) is notified. */
  set longWaitSeconds(seconds: number) {
    this._store.longWaitMs = seconds * 1000;
  }

  /** Follow the server: events first, then the listing (the store holds events until it has
   * it), the page's visibility, and kernels shut down from anywhere. */
  start(): void {
    const services = this._services;
    services.events.stream.connect((_, emission: Event.Emission) => {
      if (emission.schema_id === SCHEMA_ID) {
        this._show(this._store.apply(emission as unknown as QueueStatus));
      }
    });
    this._listing()
      .then(listing => this._show(this._store.load(listing)))
      .catch(reason => {
        console.error('kernel-queue: could not list kernels', reason);
        this._show(this._store.load([]));
      });
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'visible') {
        this.refresh();
      }
    });
    window.setInterval(() => {
      if (document.visibilityState === 'visible' && this._store.queued().length > 0) {
        this.refresh();
      }
    }, RESYNC_MS);
    let known = new Set<string>();
    services.kernels.runningChanged.connect((_, models) => {
      const now = new Set(models.map(m => m.id));
      for (const id of known) {
        if (!now.has(id)) {
          this._store.remove(id);
        }
      }
      known = now;
    });
  }

  get(kernelId: string): KernelEntry | undefined {
    return this._store.get(kernelId);
  }

  label(kernelId: string): string | null {
    return this._store.label(kernelId);
  }

  statuses() {
    return this._store.statuses();
  }

  queued() {
    return this._store.queued();
  }

  kernels() {
    return this._store.kernels();
  }

  failed() {
    return this._store.failed();
  }

  name(kernelId: string): string {
    for (const session of this._services.sessions.running()) {
      if (session.kernel?.id === kernelId && session.path) {
        return PathExt.basename(session.path);
      }
    }
    return this.trans.__('kernel %1', kernelId.slice(0, 8));
  }

  queues(): Promise<QueuesListing> {
    return getJson<QueuesListing>(this._services.serverSettings, QUEUES_PATH);
  }

  async shutdown(kernelId: string): Promise<void> {
    try {
      await this._services.kernels.shutdown(kernelId);
      this._store.remove(kernelId);
    } catch (reason) {
      Notification.error(
        this.trans.__('Could not shut down %1: %2', this.name(kernelId), String(reason))
      );
    }
  }

  async park(kernelId: string, action: 'park' | 'resume'): Promise<void> {
    const settings = this._services.serverSettings;
    try {
      const url = URLExt.join(settings.baseUrl, LISTING_PATH, kernelId, action);
      const response = await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
      const body = await response.json().catch(() => null);
      if (!response.ok) {
        // The server's sentence (a 409 says why the kernel cannot be parked).
        throw new Error(body?.message ?? `${response.status} ${response.statusText}`);
      }
      const entry = body as ListingEntry;
      if (entry.queue) {
        this._show(this._store.apply(entry.queue));
      }
    } catch (reason) {
      const why = reason instanceof Error ? reason.message : String(reason);
      const name = this.name(kernelId);
      Notification.error(
        action === 'park'
          ? this.trans.__('Could not park %1: %2', name, why)
          : this.trans.__('Could not resume %1: %2', name, why)
      );
    }
  }

  refresh(): void {
    if (this._resyncing || !this._store.loaded) {
      return;
    }
    this._resyncing = true;
    this._store.hold();
    this._listing()
      .then(listing => this._show(this._store.load(listing)))
      .catch(reason => {
        console.warn('kernel-queue: could not refresh the kernel listing', reason);
        this._show(this._store.resume());
      })
      .finally(() => (this._resyncing = false));
  }

  private _listing(): Promise<ListingEntry[]> {
    return getJson<ListingEntry[]>(this._services.serverSettings, LISTING_PATH);
  }

  /** The notebook open here whose kernel's id starts with these eight hex digits, if any. */
  private _notebookOf(shortId: string): string | null {
    for (const session of this._services.sessions.running()) {
      const id = session.kernel?.id.replace(/-/g, '');
      const name = session.path ? PathExt.basename(session.path) : '';
      if (id?.startsWith(shortId) && name && !PROVISIONAL_PATH.test(name)) {
        return name;
      }
    }
    return null;
  }

  private _show(notices: Notice[]): void {
    for (const notice of notices) {
      // The preemptor, say, named by its notebook where it is one of this user's (the kernel
      // the notice is about is already named first).
      const own = notice.kernelId.replace(/-/g, '').slice(0, 8);
      const message = namedKernels(notice.message, id =>
        id === own ? null : this._notebookOf(id)
      );
      const text = this.trans.__('%1: %2', this.name(notice.kernelId), message);
      // What happened while the user looked away stays until dismissed; a resume or a park
      // (its item says Parked meanwhile) is a short note.
      const short = notice.moment === 'resumed' || notice.moment === 'parked';
      Notification.emit(text, notice.kind, { autoClose: short ? 10000 : false });
    }
  }

  private _store: QueueStore;
  private _changed = new Signal<this, void>(this);
  private _resyncing = false;
}
