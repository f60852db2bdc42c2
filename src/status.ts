/**
 * The shape of one status event (kernel_queue/schemas/kernel-status.yaml), which the REST
 * listing carries too. Types only: what every other module reads, importing nothing.
 */

/** The kernel-status schema's states (kernel_queue/schemas/kernel-status.yaml). */
export type KernelState =
  | 'queued'
  | 'admitted'
  | 'running'
  | 'preempted'
  | 'requeued'
  | 'resumed'
  | 'parked'
  | 'finished'
  | 'failed'
  | 'cancelled';

/** The payload of one status event, and the `queue` field of the REST listing. */
export interface QueueStatus {
  kernel_id: string;
  state: KernelState;
  message: string;
  backend?: string;
  queue?: string;
  position?: number | null;
  queue_length?: number | null;
  /** Seconds until admission at the recent rate, while waiting; null without enough data (v2). */
  estimated_wait_seconds?: number | null;
  gpus?: number;
  devices?: string[];
  preemptions?: number;
  /** How often the kernel was parked so far (v3). */
  parks?: number;
  /** While parked: when it was parked (ISO 8601), else null (v3). */
  parked_since?: string | null;
  /** For a failed kernel: the kind of failure, e.g. `never_fits` (v4). */
  failure?: string | null;
}
