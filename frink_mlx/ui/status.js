// Renders one /admin/status answer (adapters/status.py) into the page.
// Text only ever goes in through textContent: model names, reasons and routes are data.

export function formatBytes(n) {
  if (n == null) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function formatDuration(s) {
  if (s == null) return "–";
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  if (d) return `${d}d ${h}h ${m}m`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${Math.floor(s % 60)}s`;
  return `${s.toFixed(1)}s`;
}

const show = (v) => (v == null ? "–" : String(v));

function setText(id, text) {
  document.getElementById(id).textContent = text;
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function row(cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

function renderMemory(m) {
  const meter = document.getElementById("memory-meter");
  const held = m.held_bytes, budget = m.budget_bytes;
  meter.value = held != null && budget ? Math.min(1, held / budget) : 0;
  let text = `${formatBytes(held)} held`;
  if (budget != null) text += ` of ${formatBytes(budget)} budget (${m.budget_source})`;
  if (m.weights_bytes != null) {
    text += ` · weights ${formatBytes(m.weights_bytes)}, KV pool ${formatBytes(m.kv_pool_bytes)}`;
  }
  setText("memory", text);
}

function renderCounters(s) {
  const c = s.counters;
  if (!c) return setText("prefix", "–");
  const rate = c.prefix_hit_rate == null ? "no prompts yet" : `${(c.prefix_hit_rate * 100).toFixed(1)}%`;
  setText("prefix", `${rate} (${c.prefix_hit_tokens_total} of ${c.prompt_tokens_total} prompt tokens)`);
}

function modelState(m) {
  const td = cell(m.state, `state-${m.state}`);
  if (m.state === "loading") {
    td.append(" ", document.createElement("progress")); // indeterminate: the loader reports no fraction
    if (m.loading_s != null) td.append(` ${m.loading_s.toFixed(0)} s`);
  }
  return td;
}

function renderModels(models) {
  const rows = models.map((m) => {
    const name = m.name + (m.default ? " (default)" : "");
    const aliases = m.aliases.length ? ` · aka ${m.aliases.join(", ")}` : "";
    const details = [m.generation != null ? `generation ${m.generation}` : "", m.reason || ""]
      .filter(Boolean).join(" · ");
    const tr = row([cell(name + aliases), cell(m.kind), modelState(m), cell(details)]);
    tr.dataset.model = m.name;
    return tr;
  });
  document.querySelector("#models tbody").replaceChildren(...rows);
}

function tokens(r) {
  if (r.prompt_tokens == null && r.completion_tokens == null) return "–";
  const cached = r.cached_tokens ? ` (${r.cached_tokens})` : "";
  return `${show(r.prompt_tokens)} / ${show(r.completion_tokens)}${cached}`;
}

function renderRecent(recent) {
  const rows = recent.slice().reverse().map((r) => {
    const time = new Date(r.at_unix * 1000).toLocaleTimeString();
    const tr = row([cell(time), cell(`${r.method} ${r.route}`), cell(show(r.model)),
      cell(String(r.status), r.status >= 400 ? "state-unavailable" : ""), cell(tokens(r)),
      cell(r.ttft_ms == null ? "–" : `${r.ttft_ms} ms`), cell(`${r.duration_ms} ms`)]);
    tr.dataset.seq = r.seq;
    return tr;
  });
  document.querySelector("#recent tbody").replaceChildren(...rows);
}

function renderDisk(d) {
  if (!d) { setText("kv-disk", "not configured"); return; }
  if (!d.enabled) { setText("kv-disk", `off (${d.error ?? "disabled"})`); return; }
  const mib = (n) => `${(n / 1048576).toFixed(1)} MiB`;
  setText("kv-disk", `${mib(d.bytes)} of ${mib(d.budget_bytes)} · ${d.files} blocks · ` +
    `${d.reads} reads, ${d.hit_blocks} blocks hit · ${d.written_blocks} written`);
}

export function renderStatus(s) {
  setText("version", `v${s.version}`);
  const pill = document.getElementById("state");
  pill.textContent = s.model ? `${s.state}: ${s.model}` : s.state;
  pill.className = `pill ${s.state}`;
  setText("uptime", formatDuration(s.uptime_s));
  setText("backend", s.backend.name);
  document.getElementById("backend").title = s.backend.device;
  renderMemory(s.memory);
  setText("context", show(s.context_ceiling));
  setText("kv-used", show(s.kv?.blocks_used));
  setText("kv-cached", show(s.kv?.blocks_cached));
  setText("kv-total", show(s.kv?.blocks_total));
  setText("kv-block-size", show(s.kv?.block_size));
  setText("running", show(s.running));
  setText("queued", show(s.queued));
  renderCounters(s);
  renderDisk(s.kv_disk);
  renderModels(s.models);
  renderRecent(s.recent);
}
