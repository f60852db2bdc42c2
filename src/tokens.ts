/**
 * The extension's one service, as a JupyterLab token: the kernel queue store. The
 * `kernel-queue:store` plugin provides it; the status bar, toolbar, Running section and queue
 * panel are plugins that require it, so each can be turned off on its own, and another
 * extension can show the same kernels its own way.
 */

import type { TranslationBundle } from '@jupyterlab/translation';
import { Token } from '@lumino/coreutils';
import type { ISignal } from '@lumino/signaling';

import type { QueuesListing } from './queues';
import type { FailedRow, KernelEntry, KernelRow, PanelRow } from './state';
import type { QueueStatus } from './status';

/** What is known of queued kernels, read-only (a `QueueStore` is one). */
export interface IQueueState {
  /** Emitted after every change of what the other members answer. */
  readonly changed: ISignal<IQueueState, void>;
  /** One kernel's entry, if it is a queued kernel the store knows. */
  get(kernelId: string): KernelEntry | undefined;
  /** The status-bar label of one kernel, null for kernels that are not queued kernels. */
  label(kernelId: string): string | null;
  /** Every kernel known, with its last status. */
  statuses(): QueueStatus[];
  /** The kernels waiting for (re-)admission, by queue then position. */
  queued(): PanelRow[];
  /** The running and parked kernels, each with what its button does. */
  kernels(): KernelRow[];
  /** The failed kernels, kept until shut down. */
  failed(): FailedRow[];
}

/** The kernel queue store: this server's queued kernels, kept current from the server's
 * listing and status events, and what can be done to them. */
export interface IKernelQueueStore extends IQueueState {
  /** The extension's strings in the user's language. */
  readonly trans: TranslationBundle;
  /** A kernel's name for people: its notebook, else "kernel 1a2b3c4d". */
  name(kernelId: string): string;
  /** Each queue's capacity, holders and waiting list (`GET /api/kernel-queue/queues`). */
  queues(): Promise<QueuesListing>;
  /** Shut a kernel down (a waiting one leaves its queue); failures are notified. */
  shutdown(kernelId: string): Promise<void>;
  /** Park a running kernel or resume a parked one; a refusal is notified. */
  park(kernelId: string, action: 'park' | 'resume'): Promise<void>;
  /** Read the server's listing again (events missed while the socket was down). */
  refresh(): void;
}

/** The token of the kernel queue store. */
export const IKernelQueueStore = new Token<IKernelQueueStore>(
  'kernel-queue:IKernelQueueStore',
  'The queued kernels of this server: their states, places and failures, and the actions on them.'
);
