// The playground: chat with a model over /v1/chat/completions, streamed.
//
// Rules:
// 1. fetch + ReadableStream reads the SSE frames as they come (EventSource cannot POST).
// 2. Stop aborts the fetch (AbortController); the daemon notices the closed connection,
//    aborts the request within one engine step and frees its KV blocks.
// 3. The conversation is kept here and sent whole each turn, so a follow-up reuses the
//    prefix cache: the usage line shows the cached prompt tokens the daemon reports.
// 4. Model output is text: it goes in as Text nodes only, never as HTML.
// 5. Deltas are painted at most once per animation frame: a fast model sends hundreds of
//    deltas a second, and touching the DOM (and scrolling) for each one starves the page's
//    main thread, so a click on Stop would wait for the answer to end.
// 6. A model with vision takes images with a message (attachments.js): its content is then
//    OpenAI's parts, the images' `image_url` parts before the text.

import { apiFetch, errorMessage } from "./api.js";
import { Attachments, thumbnail } from "./attachments.js";

async function* sseData(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}

// Text appended to two spans (reasoning, content), painted once per frame (rule 5).
class Painter {
  constructor(reasoning, content, scroller) {
    this.targets = { reasoning, content };
    this.pending = { reasoning: "", content: "" };
    this.scroller = scroller;
    this.frame = 0;
    this.text = "";  // the whole answer's content so far
  }

  add(kind, text) {
    this.pending[kind] += text;
    if (kind === "content") this.text += text;
    this.frame ||= requestAnimationFrame(() => this.flush());
  }

  flush() {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    for (const kind of ["reasoning", "content"]) {
      if (this.pending[kind]) this.targets[kind].append(this.pending[kind]);
      this.pending[kind] = "";
    }
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }
}

function element(tag, className, text = "") {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = text;
  return node;
}

export class Playground {
  constructor() {
    this.history = [];
    this.controller = null;
    this.$ = (id) => document.getElementById(id);
    this.$("pg-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    this.$("pg-input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        this.send();
      }
    });
    this.$("pg-stop").addEventListener("click", () => this.controller?.abort());
    this.$("pg-clear").addEventListener("click", () => this.clear());
    this.vision = new Map(); // model name -> it reads images (rule 6)
    this.attachments = new Attachments({
      button: this.$("pg-attach"), picker: this.$("pg-image"), list: this.$("pg-attachments"),
      note: this.$("pg-attach-note"), zone: this.$("playground"), input: this.$("pg-input"),
    });
    this.$("pg-model").addEventListener("change", () => this.syncVision());
  }

  // Generative models from the status; keeps the user's pick, else the resident model.
  setModels(models, active) {
    const select = this.$("pg-model");
    const generative = models.filter((m) => m.kind === "generative");
    this.vision = new Map(generative.map((m) => [m.name, m.vision === true]));
    const names = generative.map((m) => m.name);
    const current = [...select.options].map((o) => o.value);
    if (names.join("\n") !== current.join("\n")) {
      const keep = names.includes(select.value) ? select.value : (active ?? names[0]);
      select.replaceChildren(...names.map((n) => new Option(n, n, false, n === keep)));
    }
    this.syncVision();
  }

  syncVision() {
    this.attachments.setEnabled(this.vision.get(this.$("pg-model").value) === true);
  }

  clear() {
    this.controller?.abort();
    this.attachments.clear();
    this.history = [];
    this.$("pg-log").replaceChildren();
    this.$("pg-usage").textContent = "";
  }

  busy(on) {
    this.$("pg-send").disabled = on;
    this.$("pg-stop").disabled = !on;
  }

  request() {
    return {
      model: this.$("pg-model").value || undefined,
      messages: this.history,
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: Number(this.$("pg-max-tokens").value) || undefined,
      temperature: Number(this.$("pg-temperature").value),
    };
  }

  // Rule 6: the text alone, or the images' parts then the text's.
  static content(text, images) {
    if (!images.length) return text;
    const parts = images.map((p) => ({ type: "image_url", image_url: { url: p.url } }));
    return text ? [...parts, { type: "text", text }] : parts;
  }

  async send() {
    const text = this.$("pg-input").value.trim();
    if (this.controller || (!text && !this.attachments.pending.length)) return;
    const images = this.attachments.take();
    this.$("pg-input").value = "";
    const log = this.$("pg-log");
    const said = element("div", "msg user", text);
    if (images.length) said.prepend(...images.map((p) => thumbnail(p.preview, p.name)));
    log.append(said);
    this.history.push({ role: "user", content: Playground.content(text, images) });
    const bubble = element("div", "msg assistant");
    const reasoning = element("span", "reasoning"), content = element("span", "content");
    bubble.append(reasoning, content);
    log.append(bubble);
    const painter = new Painter(reasoning, content, log);
    this.controller = new AbortController();
    this.busy(true);
    const started = performance.now();
    const turn = { first: null, chunks: 0, usage: null, finish: null };
    try {
      await this.stream(turn, painter, started);
      painter.flush();
      bubble.dataset.finish = turn.finish || "stop";
    } catch (err) {
      painter.flush();
      const stopped = err.name === "AbortError";
      bubble.dataset.finish = stopped ? "stopped" : "error";
      if (!stopped) bubble.classList.add("failed");
      bubble.append(element("span", "note", stopped ? "stopped" : err.message));
    } finally {
      if (painter.text) this.history.push({ role: "assistant", content: painter.text });
      else this.history.pop(); // a failed turn leaves no half conversation behind
      this.controller = null;
      this.busy(false);
      this.showUsage(turn, started);
      log.scrollTop = log.scrollHeight;
    }
  }

  async stream(turn, painter, started) {
    const response = await apiFetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(this.request()),
      signal: this.controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const data of sseData(response.body)) {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) turn.usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      if (delta.reasoning_content) painter.add("reasoning", delta.reasoning_content);
      if (delta.content) {
        turn.first ??= performance.now() - started;
        turn.chunks += 1;
        painter.add("content", delta.content);
      }
      if (choice.finish_reason) turn.finish = choice.finish_reason;
    }
  }

  showUsage(turn, started) {
    const parts = [];
    const u = turn.usage;
    if (u) {
      parts.push(`prompt ${u.prompt_tokens}`, `cached ${u.prompt_tokens_details?.cached_tokens ?? 0}`,
        `completion ${u.completion_tokens}`);
      const decode_s = (performance.now() - started - (turn.first ?? 0)) / 1000;
      if (u.completion_tokens > 1 && decode_s > 0) {
        parts.push(`${((u.completion_tokens - 1) / decode_s).toFixed(1)} tok/s`);
      }
    } else if (turn.chunks) {
      parts.push(`${turn.chunks} chunks before stopping (no usage for a stopped answer)`);
    }
    if (turn.first != null) parts.push(`first token ${turn.first.toFixed(0)} ms`);
    this.$("pg-usage").textContent = parts.join(" · ");
  }
}
