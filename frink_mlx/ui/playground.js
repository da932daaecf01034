// The playground: chat with a model over /v1/chat/completions, streamed.
//
// Rules:
// 1. fetch + ReadableStream reads the SSE frames as they come (EventSource cannot POST).
// 2. Stop aborts the fetch (AbortController); the daemon notices the closed connection,
//    aborts the request within one engine step and frees its KV blocks.
// 3. The conversation is kept here and sent whole each turn, so a follow-up reuses the
//    prefix cache: the usage line shows the cached prompt tokens the daemon reports.
// 4. Model output is text: it goes in through textContent only.

import { apiFetch, errorMessage } from "./api.js";

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
  }

  // Generative models from the status; keeps the user's pick, else the resident model.
  setModels(models, active) {
    const select = this.$("pg-model");
    const names = models.filter((m) => m.kind === "generative").map((m) => m.name);
    const current = [...select.options].map((o) => o.value);
    if (names.join("\n") === current.join("\n")) return;
    const keep = names.includes(select.value) ? select.value : (active ?? names[0]);
    select.replaceChildren(...names.map((n) => new Option(n, n, false, n === keep)));
  }

  clear() {
    this.controller?.abort();
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

  async send() {
    const text = this.$("pg-input").value.trim();
    if (!text || this.controller) return;
    this.$("pg-input").value = "";
    const log = this.$("pg-log");
    log.append(element("div", "msg user", text));
    this.history.push({ role: "user", content: text });
    const bubble = element("div", "msg assistant");
    const reasoning = element("span", "reasoning"), content = element("span", "content");
    bubble.append(reasoning, content);
    log.append(bubble);
    this.controller = new AbortController();
    this.busy(true);
    const started = performance.now();
    const turn = { first: null, chunks: 0, usage: null, finish: null };
    try {
      await this.stream(turn, reasoning, content, started);
      bubble.dataset.finish = turn.finish || "stop";
    } catch (err) {
      const stopped = err.name === "AbortError";
      bubble.dataset.finish = stopped ? "stopped" : "error";
      if (!stopped) bubble.classList.add("failed");
      bubble.append(element("span", "note", stopped ? "stopped" : err.message));
    } finally {
      if (content.textContent) this.history.push({ role: "assistant", content: content.textContent });
      else this.history.pop(); // a failed turn leaves no half conversation behind
      this.controller = null;
      this.busy(false);
      this.showUsage(turn, started);
      log.scrollTop = log.scrollHeight;
    }
  }

  async stream(turn, reasoning, content, started) {
    const response = await apiFetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(this.request()),
      signal: this.controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    const log = this.$("pg-log");
    for await (const data of sseData(response.body)) {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) turn.usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      if (delta.reasoning_content) reasoning.textContent += delta.reasoning_content;
      if (delta.content) {
        turn.first ??= performance.now() - started;
        turn.chunks += 1;
        content.textContent += delta.content;
        log.scrollTop = log.scrollHeight;
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
