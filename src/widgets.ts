/**
 * The two small widgets that show one kernel's queue state: the status-bar item (opens the
 * panel) and the notebook toolbar's indicator (while the kernel cannot run cells). Each shows
 * the state's JupyterLab icon and colour (`look.ts`'s tone) and the whole sentence as tooltip.
 */

import {
  checkIcon,
  errorIcon,
  historyIcon,
  LabIcon,
  offlineBoltIcon,
  pauseIcon,
  runningIcon
} from '@jupyterlab/ui-components';
import type { TranslationBundle } from '@jupyterlab/translation';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { ENGLISH, spoken, Tone } from './look';

/** One JupyterLab icon per tone; the colour is the tone's CSS class (style/index.css). */
export const ICONS: Record<Tone, LabIcon> = {
  queued: historyIcon,
  admitted: checkIcon,
  running: runningIcon,
  preempted: offlineBoltIcon,
  parked: pauseIcon,
  failed: errorIcon
};

const TONES = Object.keys(ICONS).map(tone => `jp-KernelQueue-tone-${tone}`);

/** Fill `node` with the tone's icon and `text`; `tone` null: a plain item, no icon. */
function paint(node: HTMLElement, tone: Tone | null, text: string): void {
  node.classList.remove(...TONES);
  node.replaceChildren();
  if (tone !== null) {
    node.classList.add(`jp-KernelQueue-tone-${tone}`);
    node.appendChild(
      ICONS[tone].element({
        tag: 'span',
        className: 'jp-KernelQueue-icon',
        height: '14px',
        width: '14px'
      })
    );
  }
  const label = document.createElement('span');
  label.className = 'jp-KernelQueue-text';
  label.textContent = text;
  node.appendChild(label);
}

/** The status-bar item: the current notebook's kernel as the queue sees it, while it waits,
 * fails or is parked; "Queue · N waiting" while others wait; hidden otherwise. */
export class QueueStatusItem extends Widget {
  constructor(trans: TranslationBundle = ENGLISH) {
    super({ node: document.createElement('div') });
    this._trans = trans;
    this._hint = trans.__('Kernel queue: click, or press Enter, for the queues');
    this.addClass('jp-KernelQueue-status');
    this.node.title = this._hint;
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

  /**
   * Show `text` in `tone` (the server's `sentence` as tooltip), or hide the item when `text`
   * is null. `state` (the kernel's state, e.g. "running") and `kernelId` go to data
   * attributes, so that a hidden item still says which kernel it follows.
   */
  display(
    text: string | null,
    tone: Tone | null,
    kernelId: string | null,
    sentence: string | null,
    state: string
  ): void {
    const was = this.active;
    this._text = text;
    paint(this.node, tone, text ?? '');
    this.node.title = sentence ? `${sentence}\n(${this._hint})` : this._hint;
    this.node.setAttribute('aria-label', spoken(text ?? '', sentence, this._trans));
    this.node.dataset.kernelId = kernelId ?? '';
    this.node.dataset.state = state;
    if (was !== this.active) {
      this._activeStateChanged.emit();
    }
  }

  private _text: string | null = null;
  private _activeStateChanged = new Signal<this, void>(this);
  private _trans: TranslationBundle;
  private _hint: string;
}

/** The notebook toolbar's indicator: "Waiting for 1 GPU · #2 in gpu" beside JupyterLab's
 * kernel name while the kernel waits or starts, "Failed · …" once it failed; hidden once it
 * runs. A polite live region, so a screen reader hears each change. */
export class WaitingIndicator extends Widget {
  constructor() {
    super({ node: document.createElement('div') });
    this.addClass('jp-KernelQueue-indicator');
    this.addClass('jp-Toolbar-item');
    this.node.setAttribute('role', 'status');
    this.node.setAttribute('aria-live', 'polite');
    this.hide();
  }

  /** Show `text` in `tone` with `sentence` as tooltip, or hide when `text` is null. */
  display(text: string | null, tone: Tone, sentence: string | null): void {
    if (text === null) {
      this.hide();
      this.node.replaceChildren();
      return;
    }
    paint(this.node, tone, text);
    this.node.title = sentence ?? text;
    this.node.dataset.tone = tone;
    this.show();
  }
}
