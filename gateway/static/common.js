// Shared by the playground and the dashboard: API calls with the tab's API key, the key
// prompt, small formatting helpers. Plain browser JavaScript, no build step, no dependencies.
"use strict";

const VG = (() => {
  const KEY = "vision-gateway-api-key"; // sessionStorage: this tab only, gone when it closes

  function apiKey() {
    return sessionStorage.getItem(KEY) || "";
  }

  function withKey(headers) {
    const out = Object.assign({}, headers || {});
    const key = apiKey();
    if (key) out.Authorization = "Bearer " + key;
    return out;
  }

  // fetch() against the gateway with the tab's key; a 401 opens the key prompt.
  async function request(path, options) {
    const opts = Object.assign({}, options || {});
    opts.headers = withKey(opts.headers);
    const response = await fetch(path, opts);
    if (response.status === 401) {
      askForKey(apiKey() ? "The server refused that key." : "");
    }
    return response;
  }

  // {message, param} of an OpenAI error object, else the status line (param null).
  async function errorDetails(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) {
        return { message: body.error.message, param: body.error.param || null };
      }
    } catch (_) {
      // not JSON: fall through to the status
    }
    return { message: `HTTP ${response.status} ${response.statusText}`.trim(), param: null };
  }

  async function errorMessage(response) {
    return (await errorDetails(response)).message;
  }

  function askForKey(message) {
    const box = document.getElementById("key-prompt");
    box.hidden = false;
    document.getElementById("key-error").textContent = message || "";
    document.getElementById("api-key").focus();
  }

  // Wire the key form: on submit keep the key for this tab and call `retry`.
  function setupKeyPrompt(retry) {
    document.getElementById("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = document.getElementById("api-key");
      sessionStorage.setItem(KEY, input.value.trim());
      input.value = "";
      document.getElementById("key-prompt").hidden = true;
      retry();
    });
  }

  function formatBytes(n) {
    if (n === null || n === undefined) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return (i === 0 ? String(n) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
  }

  function formatPercent(x) {
    return x === null || x === undefined ? "—" : (100 * x).toFixed(1) + "%";
  }

  function formatAge(seconds) {
    if (seconds < 60) return seconds.toFixed(0) + " s";
    if (seconds < 3600) return (seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  // document.createElement with attributes (data-* and testid included) and children.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "testid") node.dataset.testid = value;
      else if (name === "text") node.textContent = value;
      else if (name === "className") node.className = value;
      else node.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  return { request, errorDetails, errorMessage, askForKey, setupKeyPrompt, formatBytes, formatPercent, formatAge, el };
})();
