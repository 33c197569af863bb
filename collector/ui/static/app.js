// tokenpath UI: API client, bearer-token prompt, hash router and live polling.
// Views live in views.js; charts and formatting in charts.js.
"use strict";

const TOKEN_KEY = "tokenpath.token";
const WINDOW_KEY = "tokenpath.window";
const DEFAULT_WINDOW = "1h";
const POLL_MS = 3000;

class AuthRequired extends Error {}

const app = {
  stages: null, // from /api/stages: order and names never live in this file
  pollTimer: null,
  renderSeq: 0,
  authWaiters: [],
};

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// The time window the record views cover: `since` on every record endpoint ("all": none).
function timeWindow() {
  return sessionStorage.getItem(WINDOW_KEY) || DEFAULT_WINDOW;
}

function withWindow(path) {
  const since = timeWindow();
  if (since === "all") return path;
  return `${path}${path.includes("?") ? "&" : "?"}since=${encodeURIComponent(since)}`;
}

function setupWindowSelect() {
  const select = document.getElementById("window-select");
  select.value = timeWindow();
  select.addEventListener("change", () => {
    sessionStorage.setItem(WINDOW_KEY, select.value);
    route();
  });
}

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  if (response.status === 401) {
    if (t) sessionStorage.removeItem(TOKEN_KEY);
    promptForToken(t ? "The token was rejected. Enter the collector's bearer token." : null);
    throw new AuthRequired("unauthorized");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = await response.json();
      detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    } catch (_) { /* not JSON */ }
    throw new Error(`${path}: ${response.status} ${detail}`);
  }
  return response.json();
}

function promptForToken(message) {
  const dialog = document.getElementById("auth-dialog");
  if (message) document.getElementById("auth-message").textContent = message;
  setLive("sign-in needed", "off");
  if (!dialog.open) {
    dialog.showModal();
    document.getElementById("auth-token").focus();
  }
}

function setupAuthDialog() {
  const form = document.getElementById("auth-form");
  const dialog = document.getElementById("auth-dialog");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("auth-token");
    const value = input.value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    input.value = "";
    dialog.close();
    route();
  });
  dialog.addEventListener("cancel", (event) => event.preventDefault());
}

function setLive(text, state = "on") {
  document.getElementById("live-text").textContent = text;
  document.querySelector(".live").dataset.state = state;
}

function showBanner(message) {
  const banner = document.getElementById("banner");
  banner.textContent = message || "";
  banner.hidden = !message;
}

async function loadStages() {
  if (!app.stages) {
    const stages = await api("/api/stages");
    app.stages = stages.slice().sort((a, b) => a.order - b.order);
  }
  return app.stages;
}

// Live views re-render every few seconds; keep keyboard focus on the same link or control.
function focusedKey(view) {
  const active = document.activeElement;
  if (!active || !view.contains(active) || active === view) return null;
  if (active.id) return { id: active.id };
  const href = active.getAttribute("href");
  return href ? { href } : null;
}

function restoreFocus(view, key) {
  if (!key) return;
  const target = key.id ? document.getElementById(key.id)
    : [...view.querySelectorAll("a[href]")].find((a) => a.getAttribute("href") === key.href);
  if (target) target.focus({ preventScroll: true });
}

// --- routing ------------------------------------------------------------------------------

function parseRoute() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean);
  if (parts[0] === "requests" && parts[1]) {
    let traceId;
    try {
      traceId = decodeURIComponent(parts[1]);
    } catch (error) { // a malformed escape: ask for it as typed, the API answers 404
      traceId = parts[1];
    }
    return { name: "request", traceId, nav: "requests" };
  }
  const name = parts[0] || "overview";
  const known = ["overview", "requests", "leaks", "whatif"];
  return { name: known.includes(name) ? name : "overview", nav: name };
}

async function route() {
  const current = parseRoute();
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.route === current.nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  clearTimeout(app.pollTimer);
  const seq = ++app.renderSeq;
  const view = document.getElementById("view");
  const render = window.tpViews[current.name];
  const live = render.live === true;
  let first = true;
  const tick = async () => {
    if (seq !== app.renderSeq) return;
    if (live && !first && document.hidden) { // no polling from a background tab
      app.pollTimer = setTimeout(tick, POLL_MS);
      return;
    }
    try {
      await loadStages();
      const content = await render(current);
      if (seq !== app.renderSeq) return;
      const focusKey = focusedKey(view);
      view.replaceChildren(content);
      restoreFocus(view, focusKey);
      if (first) {
        first = false;
        const heading = view.querySelector("h1");
        if (heading) {
          heading.setAttribute("tabindex", "-1");
          heading.focus({ preventScroll: true });
        }
      }
      showBanner(null);
      setLive(live ? `live · updated ${tp.fmtTime(Date.now() / 1000)}` : "connected",
              live ? "on" : "idle");
      view.dataset.route = location.hash || "#/"; // which view is on screen (tests wait on it)
      view.dataset.ready = "true";
    } catch (error) {
      if (error instanceof AuthRequired) return;
      showBanner(`Could not load data: ${error.message}`);
      setLive("disconnected", "off");
    }
    if (live && seq === app.renderSeq) app.pollTimer = setTimeout(tick, POLL_MS);
  };
  view.dataset.ready = "false";
  await tick();
}

window.tpApp = { api, loadStages, withWindow, timeWindow, AuthRequired };

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => {
  setupAuthDialog();
  setupWindowSelect();
  route();
});
