// The status page: polls /admin/status once a second, renders it, charts the rates.
//
// Rates come from the daemon's own counters (adapters/status.py rule 3): decode tok/s is
// the change in generated_tokens_total over the change in uptime between two polls of the
// same model generation; TTFT is the mean of the requests that finished since the last poll
// (the access ring's new records). No new record with a TTFT means a gap, not a zero.

import { apiJSON, forgetKey, storedKey } from "./api.js";
import { Chart } from "./chart.js";
import { Playground } from "./playground.js";
import { renderStatus } from "./status.js";

const POLL_MS = 1000;

const chart = new Chart(document.getElementById("chart"), [
  { color: "--tok", label: "tok/s" },
  { color: "--ttft", label: "TTFT ms" },
]);
const playground = new Playground();
let previous = null;
let lastSeq = null; // the newest access record already charted
let rendered = false;

function decodeRate(prev, now) {
  if (!prev?.counters || !now.counters || prev.generation !== now.generation) return null;
  const dt = now.uptime_s - prev.uptime_s;
  if (dt <= 0) return null;
  return (now.counters.generated_tokens_total - prev.counters.generated_tokens_total) / dt;
}

function newTtft(recent) {
  const seen = lastSeq;
  lastSeq = recent.reduce((m, r) => Math.max(m, r.seq), lastSeq ?? 0);
  if (seen == null) return null; // the first poll is the baseline
  const fresh = recent.filter((r) => r.seq > seen && r.ttft_ms != null).map((r) => r.ttft_ms);
  return fresh.length ? fresh.reduce((a, b) => a + b, 0) / fresh.length : null;
}

function showRates(tokS, ttft) {
  if (tokS != null) document.getElementById("tok-s").textContent = tokS.toFixed(1);
  if (ttft != null) document.getElementById("ttft").textContent = ttft.toFixed(0);
}

function setConnection(text, failed) {
  document.getElementById("conn").textContent = text;
  if (failed) document.getElementById("state").className = "pill offline";
}

async function poll() {
  try {
    if (!document.hidden) {
      const status = await apiJSON("/admin/status");
      renderStatus(status);
      const tokS = decodeRate(previous, status), ttft = newTtft(status.recent);
      chart.push([tokS, ttft]);
      showRates(tokS, ttft);
      playground.setModels(status.models, status.model);
      previous = status;
      setConnection("", false);
      if (!rendered) {
        rendered = true;
        performance.mark("frink:first-status");
      }
    }
  } catch (err) {
    setConnection(`daemon unreachable: ${err.message}`, true);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.getElementById("forget-key").hidden = !storedKey();
document.getElementById("forget-key").addEventListener("click", () => {
  forgetKey();
  location.reload();
});
window.addEventListener("resize", () => chart.draw());
poll();
