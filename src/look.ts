/**
 * How a kernel's queue state looks: its tone (which icon and colour the widgets give it), the
 * short label of a failure, and the words a screen reader hears. Pure: no DOM.
 */

import type { QueueStatus } from './status';

/** "1 GPU", "2 GPUs". */
export function gpuCount(gpus: number): string {
  return `${gpus} ${gpus === 1 ? 'GPU' : 'GPUs'}`;
}

/** The server's sentence while a kernel saves to park ("parking after 30 min idle: saving…"). */
export function isParking(status: QueueStatus): boolean {
  return status.state === 'parked' && /^parking\b/.test(status.message);
}

/** A woken kernel back in its queue ("waking from parked: queued in 'gpu', position 1 …"). */
export function isWaking(status: QueueStatus): boolean {
  return status.state === 'requeued' && /^waking from parked\b/.test(status.message);
}

/** The look of a state: one icon and one colour each (style/index.css, `jp-KernelQueue-tone-*`). */
export type Tone = 'queued' | 'admitted' | 'running' | 'preempted' | 'parked' | 'failed';

/** The tone of a status: a woken kernel back in its queue waits like a queued one. */
export function toneOf(status: QueueStatus): Tone {
  switch (status.state) {
    case 'queued':
      return 'queued';
    case 'requeued':
      return isWaking(status) ? 'queued' : 'preempted';
    case 'preempted':
      return 'preempted';
    case 'admitted':
      return 'admitted';
    case 'parked':
      return isParking(status) ? 'preempted' : 'parked';
    case 'failed':
      return 'failed';
    default:
      return 'running';
  }
}

/** True while the kernel cannot run cells yet: it waits for (re-)admission or starts. */
export function isWaiting(status: QueueStatus): boolean {
  return ['queued', 'requeued', 'preempted', 'admitted'].includes(status.state);
}

const REASONS: [RegExp, (m: RegExpMatchArray) => string][] = [
  // quota.py: "asks for 3 GPU(s) but this machine has 2 [pretend ]GPU(s) in all"
  [
    /asks for (\d+) GPU\(s\) but this machine has (\d+) (?:pretend )?GPU\(s\)/,
    m => `needs ${gpuCount(Number(m[1]))}, ${m[2]} ${m[2] === '1' ? 'exists' : 'exist'}`
  ],
  // kube: "asks for 3 nvidia.com/gpu but ClusterQueue 'cq' can never give more than 1"
  [
    /asks for (\d+) \S*gpu\S* but ClusterQueue '[^']+' can never give more than (\d+)/,
    m => `needs ${gpuCount(Number(m[1]))}, queue has ${m[2]}`
  ],
  [/asks for (\S+) CPU but the local quota is (\S+?),/, m => `needs ${m[1]} CPU, ${m[2]} exist`],
  [/asks for (\S+) memory but the local quota is (\S+?),/, m => `needs ${m[1]} memory, ${m[2]} exist`],
  [/LocalQueue '([^']+)' does not exist/, m => `no queue '${m[1]}'`],
  [/queue '([^']+)' does not exist/, m => `no queue '${m[1]}'`],
  [/priority class '([^']+)' does not exist/, m => `no priority class '${m[1]}'`],
  [/without being admitted/, () => 'gave up waiting'],
  [/needs? (\d+) GPUs?\b.*\b(\d+) exists?/, m => `needs ${gpuCount(Number(m[1]))}, ${m[2]} exist`]
];

/** What the event's `failure` kind (schema version 4) says where the sentence is not known. */
const KINDS: Record<string, string> = {
  never_fits: 'can never fit its queue',
  queue_not_found: 'no such queue',
  priority_class_not_found: 'no such priority class',
  config: 'kernelspec error',
  admission_timeout: 'gave up waiting',
  startup_timeout: 'did not start in time'
};

/**
 * A failure's label, short enough for the status bar: `Failed · needs 3 GPUs, 2 exist`,
 * `Failed · no queue 'nosuch'`, `Failed · gave up waiting`; else what the `failure` kind says;
 * plain `Failed` for anything else (the tooltip has the whole sentence either way).
 */
export function failedLabel(message: string, failure?: string | null): string {
  for (const [pattern, say] of REASONS) {
    const match = message.match(pattern);
    if (match) {
      return `Failed · ${say(match)}`;
    }
  }
  const kind = failure ? KINDS[failure] : undefined;
  return kind ? `Failed · ${kind}` : 'Failed';
}

/** What the in-notebook indicator says while the kernel cannot run cells, or null. */
export function indicatorText(status: QueueStatus, label: string): string | null {
  switch (toneOf(status)) {
    case 'queued': {
      const what = status.gpus ? gpuCount(status.gpus) : 'its queue';
      return label.replace(/^(Queued|Waking)/, `Waiting for ${what}`);
    }
    case 'preempted':
      return label;
    case 'admitted':
      return `${label} · starting`;
    case 'failed':
      return label;
    default:
      return null; // running or parked: JupyterLab's own kernel status says enough
  }
}

/** What a screen reader hears for the status item: the label and the whole sentence. */
export function spoken(label: string, sentence: string | null): string {
  return sentence ? `Kernel queue: ${label}. ${sentence}` : `Kernel queue: ${label}`;
}

/**
 * `text` with each "kernel 1a2b3c4d" that `name` knows (a kernel of a notebook open here, by the
 * first eight hex digits of its id) said as that notebook: "preempted by higher-priority
 * kernel 844a8577" reads "preempted by higher-priority train.ipynb (kernel 844a8577)".
 */
export function namedKernels(text: string, name: (shortId: string) => string | null): string {
  return text.replace(/\bkernel ([0-9a-f]{8})\b/g, (whole, shortId: string) => {
    const known = name(shortId);
    return known ? `${known} (${whole})` : whole;
  });
}
