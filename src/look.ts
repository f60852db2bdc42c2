/**
 * How a kernel's queue state looks: its tone (which icon and colour the widgets give it), the
 * short label of a failure, and the words a screen reader hears. Pure: no DOM. Everything is
 * read from the status event's fields (schema version 5: `failure`, `needs`, `has`, `queue`,
 * `priority_class`, `saving`, `waking`), never from the server's sentence, which is shown
 * whole as a tooltip; every word goes through the translation bundle `trans`.
 */

import { nullTranslator, type ITranslator, type TranslationBundle } from '@jupyterlab/translation';

import type { QueueStatus } from './status';

/** The extension's translation domain. */
export const DOMAIN = 'kernel_queue';

/** The extension's strings in the user's language (English without a translator). */
export function bundle(translator?: ITranslator | null): TranslationBundle {
  return (translator ?? nullTranslator).load(DOMAIN);
}

/** English: what the pure modules say when no bundle is passed (tests, and a lab without
 * translations). */
export const ENGLISH = bundle();

/** "1 GPU", "2 GPUs". */
export function gpuCount(gpus: number, trans: TranslationBundle = ENGLISH): string {
  return trans._n('%1 GPU', '%1 GPUs', gpus);
}

/** A parked kernel that still saves its variables before giving its GPUs back. */
export function isParking(status: QueueStatus): boolean {
  return status.state === 'parked' && status.saving === true;
}

/** A woken kernel back in its queue (requeued because it was parked, not preempted). */
export function isWaking(status: QueueStatus): boolean {
  return status.state === 'requeued' && status.waking === true;
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

/** What the queue could ever give, from the event's `has`: "2 exist" on the local machine,
 * "queue has 1" on a cluster; null where the server did not say. */
function hasWords(status: QueueStatus, trans: TranslationBundle): string | null {
  const [resource, amount] = Object.entries(status.has ?? {})[0] ?? [];
  if (resource === undefined || amount === undefined) {
    return null;
  }
  if (status.backend !== 'local') {
    return trans.__('queue has %1', amount);
  }
  if (typeof amount === 'number') {
    return trans._n('%1 exists', '%1 exist', amount);
  }
  return trans.__('%1 exist', amount);
}

/** Why a kernel failed, in a few words, from the event's fields; null where they say nothing
 * short (the tooltip has the whole sentence). */
function failureWords(status: QueueStatus, trans: TranslationBundle): string | null {
  switch (status.failure) {
    case 'never_fits': {
      const needs = status.needs || (status.gpus ? gpuCount(status.gpus, trans) : null);
      const has = hasWords(status, trans);
      if (needs && has) {
        return trans.__('needs %1, %2', needs, has);
      }
      return needs ? trans.__('needs %1, can never fit', needs) : trans.__('can never fit its queue');
    }
    case 'queue_not_found':
      return status.queue ? trans.__("no queue '%1'", status.queue) : trans.__('no such queue');
    case 'priority_class_not_found':
      return status.priority_class
        ? trans.__("no priority class '%1'", status.priority_class)
        : trans.__('no such priority class');
    case 'config':
      return trans.__('kernelspec error');
    case 'admission_timeout':
      return trans.__('gave up waiting');
    case 'startup_timeout':
      return trans.__('did not start in time');
    default:
      return null; // launch, cancelled, or none: plain "Failed"
  }
}

/**
 * A failure's label, short enough for the status bar: `Failed · needs 3 GPUs, 2 exist`,
 * `Failed · no queue 'nosuch'`, `Failed · gave up waiting`; plain `Failed` where the fields say
 * nothing short (the tooltip has the whole sentence either way).
 */
export function failedLabel(status: QueueStatus, trans: TranslationBundle = ENGLISH): string {
  const why = failureWords(status, trans);
  return why ? trans.__('Failed · %1', why) : trans.__('Failed');
}

/** A waiting kernel's place and estimate, as the labels append them: ["#2 in gpu", "~4 min"]
 * for a queued kernel, ["#1"] for a requeued one (its queue is the one it left). */
export function placeWords(
  status: QueueStatus,
  estimate: string | null,
  trans: TranslationBundle = ENGLISH
): string[] {
  const position = status.position ? `#${status.position}` : null;
  let place = position;
  if (status.state === 'queued' && status.queue) {
    place = position
      ? trans.__('%1 in %2', position, status.queue)
      : trans.__('in %1', status.queue);
  }
  return [place, estimate].filter((part): part is string => Boolean(part));
}

/** What the in-notebook indicator says while the kernel cannot run cells, or null; `label` is
 * the status-bar label, `estimate` the wait's estimate as the label says it. */
export function indicatorText(
  status: QueueStatus,
  label: string,
  estimate: string | null = null,
  trans: TranslationBundle = ENGLISH
): string | null {
  switch (toneOf(status)) {
    case 'queued': {
      const what = status.gpus ? gpuCount(status.gpus, trans) : trans.__('its queue');
      const waiting = trans.__('Waiting for %1', what);
      return [waiting, ...placeWords(status, estimate, trans)].join(' · ');
    }
    case 'preempted':
      return label;
    case 'admitted':
      return trans.__('%1 · starting', label);
    case 'failed':
      return label;
    default:
      return null; // running or parked: JupyterLab's own kernel status says enough
  }
}

/** What a screen reader hears for the status item: the label and the whole sentence. */
export function spoken(
  label: string,
  sentence: string | null,
  trans: TranslationBundle = ENGLISH
): string {
  return sentence
    ? trans.__('Kernel queue: %1. %2', label, sentence)
    : trans.__('Kernel queue: %1', label);
}

/**
 * `text` with each "kernel 1a2b3c4d" that `name` knows (a kernel of a notebook open here, by the
 * first eight hex digits of its id) said as that notebook: "preempted by higher-priority
 * kernel 844a8577" reads "preempted by higher-priority train.ipynb (kernel 844a8577)". The
 * server names other kernels only in its sentences (the preemptor is Kueue's or the machine
 * queue's word), so this one pattern stays: it finds an id, it does not read the sentence.
 */
export function namedKernels(text: string, name: (shortId: string) => string | null): string {
  return text.replace(/\bkernel ([0-9a-f]{8})\b/g, (whole, shortId: string) => {
    const known = name(shortId);
    return known ? `${known} (${whole})` : whole;
  });
}
