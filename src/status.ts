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
  /** What the kernel asks for, in words: "2 GPUs, 4 CPU"; null where not known (v5). */
  needs?: string | null;
  /** For a failed kernel: the most its queue could ever give of what it lacks, where the
   * server knows it: `{gpus: 2}`, `{cpu: "16"}` (v5). */
  has?: Record<string, number | string> | null;
  /** The priority class the kernel asked for (v5). */
  priority_class?: string | null;
  /** Saving its variables: parked but still parking, or preempted with checkpoints on (v5). */
  saving?: boolean;
  /** Requeued because it was woken from parked, not preempted (v5). */
  waking?: boolean;
}
