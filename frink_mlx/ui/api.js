// Requests to the daemon that served this page, with its API key when it asks for one.
//
// Rules:
// 1. Same origin only: every path is relative, so the page never talks to another host
//    (its Content-Security-Policy says connect-src 'self' as well).
// 2. On a 401 the page asks for the key once, however many requests got the 401 (one shared
//    prompt), keeps it in sessionStorage (this tab only, gone when the tab closes) and repeats
//    the request with `Authorization: Bearer KEY`. A wrong key gets the daemon's message and
//    the prompt again.
// 3. Errors keep the daemon's own message (the OpenAI envelope's error.message).

const KEY_NAME = "frink-mlx.api-key";
let pendingKey = null; // rule 2: the one open prompt, shared by every waiting request

export function storedKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body?.error?.message || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

function withKey(init) {
  const headers = new Headers(init.headers || {});
  const key = storedKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  return { ...init, headers };
}

function askForKey(message) {
  if (pendingKey) return pendingKey;
  const dialog = document.getElementById("key-dialog");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  document.getElementById("key-error").textContent = message;
  pendingKey = new Promise((resolve) => {
    form.onsubmit = (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_NAME, key);
      input.value = "";
      dialog.close();
      pendingKey = null;
      document.getElementById("forget-key").hidden = false;
      resolve();
    };
  });
  dialog.oncancel = (event) => event.preventDefault(); // nothing works without the key
  dialog.showModal();
  input.focus();
  return pendingKey;
}

// fetch(path, init) with the key; a 401 asks for it and repeats the request (rule 2).
export async function apiFetch(path, init = {}) {
  for (;;) {
    const sent = storedKey();
    const response = await fetch(path, withKey(init));
    if (response.status !== 401) return response;
    const message = await errorMessage(response);
    if (storedKey() === sent) await askForKey(message);
    init.signal?.throwIfAborted();
  }
}

export async function apiJSON(path, init = {}) {
  const response = await apiFetch(path, init);
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  return response.json();
}
