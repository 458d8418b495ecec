// Kapok console: live refresh of the server-rendered pages. No framework, no build step.
//
// A page's <main data-api="/console/api/..."> names the JSON it refreshes from. Elements
// say what they show with data attributes, relative to the nearest [data-scope] (the page,
// or one row of a list), so the markup exists once, in the Jinja templates:
//   data-k="a.b" [data-fmt="num|bytes|rate|time|dur|ms"]  text of that value
//   data-rows="a.b"       a list: its <template> is cloned per item (each clone a scope)
//   data-href-k="a.b"     href from that value (http(s) URLs and console paths only)
//   data-class-k="a.b"    adds the class "is-<value>" (states, roles)
//   data-show-k="a.b"     hidden unless that value is truthy (data-hide-k: the reverse)
//   data-chart="line|bars" data-path="a.b"  an SVG chart (charts.js) of that value
// The refresh period is the user's choice (kept in localStorage: a setting, never a secret).
"use strict";

const Kapok = (() => {
  const DASH = "—";
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  const nf2 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  const nf1 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
  const nf0 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

  // The same formats as kapok/console/format.py (tests/browser/test_console_format.py checks).
  const FORMATS = {
    num: (v) => (Number.isInteger(v) ? nf0.format(v) : nf2.format(v)),
    bytes: (v) => {
      let size = Number(v);
      for (const unit of UNITS) {
        if (Math.abs(size) < 1024 || unit === UNITS[UNITS.length - 1]) {
          return unit === "B" ? `${Math.trunc(size)} B` : `${size.toFixed(1)} ${unit}`;
        }
        size /= 1024;
      }
      return DASH;
    },
    rate: (v) => `${nf1.format(Number(v))}/s`,
    time: (v) => (!v ? DASH : new Date(Number(v) * 1000).toISOString().slice(0, 19).replace("T", " ")),
    dur: (v) => {
      const x = Number(v);
      const s = Math.trunc(x);
      if (s < 60) return x < 10 ? `${x.toFixed(1)} s` : `${s} s`;
      const m = Math.trunc(s / 60);
      if (m < 60) return `${m} min ${s % 60} s`;
      const h = Math.trunc(m / 60);
      if (h < 48) return `${h} h ${m % 60} min`;
      return `${Math.trunc(h / 24)} d ${h % 24} h`;
    },
    ms: (v) => `${nf1.format(Number(v))} ms`,
  };

  function fmt(value, kind) {
    if (value === null || value === undefined || value === "") return DASH;
    if (typeof value === "number" && !Number.isFinite(value)) return DASH;
    if (typeof value === "boolean") return value ? "yes" : "no";
    const f = FORMATS[kind || ""];
    return f && typeof value === "number" ? f(value) : String(value);
  }

  function pick(obj, path) {
    let v = obj;
    for (const part of path.split(".")) {
      if (v === null || v === undefined) return undefined;
      v = v[part];
    }
    return v;
  }

  // The same as the "cls" filter of kapok/console/format.py.
  function classPart(v) {
    return (typeof v === "boolean" ? (v ? "yes" : "no") : String(v)).replace(/\W/g, "");
  }

  function safeHref(v) {
    if (typeof v !== "string") return null;
    return /^https?:\/\//i.test(v) || v.startsWith("/console/") ? v : null;
  }

  const SELECTOR = "[data-k],[data-rows],[data-href-k],[data-class-k],[data-show-k],[data-hide-k],[data-chart]";

  function owned(scope) {
    return [...scope.querySelectorAll(SELECTOR)].filter(
      (el) => (el.parentElement && el.parentElement.closest("[data-scope]")) === scope,
    );
  }

  function fill(scope, data) {
    for (const el of owned(scope)) {
      const d = el.dataset;
      if (d.k !== undefined) el.textContent = fmt(pick(data, d.k), d.fmt);
      if (d.hrefK !== undefined) {
        const href = safeHref(pick(data, d.hrefK));
        if (href) el.setAttribute("href", href);
        else el.removeAttribute("href");
      }
      if (d.classK !== undefined) {
        for (const c of [...el.classList]) if (c.startsWith("is-")) el.classList.remove(c);
        const v = pick(data, d.classK);
        if (v !== null && v !== undefined && v !== "") el.classList.add(`is-${classPart(v)}`);
      }
      if (d.showK !== undefined) el.hidden = !pick(data, d.showK);
      if (d.hideK !== undefined) el.hidden = Boolean(pick(data, d.hideK));
      if (d.rows !== undefined) fillRows(el, pick(data, d.rows) || []);
      if (d.chart !== undefined && typeof KapokCharts !== "undefined") KapokCharts.draw(el, pick(data, d.path));
    }
  }

  function fillRows(container, items) {
    const template = container.querySelector(":scope > template");
    if (!template) return;
    for (const old of [...container.children]) if (old !== template) old.remove();
    for (const item of items) {
      const row = template.content.firstElementChild.cloneNode(true);
      row.setAttribute("data-scope", "");
      container.appendChild(row);
      fill(row, item);
    }
    // An element of class "empty" right after the list (or its table) says it is empty.
    const empty = (container.closest("table") || container).nextElementSibling;
    if (empty && empty.classList.contains("empty")) empty.hidden = items.length > 0;
  }

  // --- refresh -------------------------------------------------------------------------
  const KEY = "kapok.refresh_s";
  let timer = null;

  async function refresh(main) {
    const status = document.getElementById("live-status");
    try {
      const response = await fetch(main.dataset.api, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.status === 401) {
        window.location.assign(`/console/login?next=${encodeURIComponent(location.pathname + location.search)}`);
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      fill(main, await response.json());
      if (status) {
        status.textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
        status.classList.remove("is-error");
      }
    } catch (err) {
      if (status) {
        status.textContent = `not updated: ${err.message}`;
        status.classList.add("is-error");
      }
    }
  }

  function schedule(main, seconds) {
    if (timer) clearInterval(timer);
    timer = null;
    const floor = Number(main.dataset.refreshMin || 0);
    if (seconds > 0) timer = setInterval(() => refresh(main), Math.max(seconds, floor) * 1000);
  }

  function start() {
    for (const form of document.querySelectorAll("form[data-confirm]")) {
      form.addEventListener("submit", (ev) => {
        if (!window.confirm(form.dataset.confirm)) ev.preventDefault();
      });
    }
    const main = document.querySelector("main[data-api]");
    const initial = document.getElementById("page-data");
    if (main && initial) fill(main, JSON.parse(initial.textContent));
    const select = document.getElementById("refresh");
    if (!main || !select) {
      if (select) select.disabled = true;
      return;
    }
    const saved = localStorage.getItem(KEY);
    if (saved !== null && [...select.options].some((o) => o.value === saved)) select.value = saved;
    select.addEventListener("change", () => {
      localStorage.setItem(KEY, select.value);
      schedule(main, Number(select.value));
      refresh(main);
    });
    schedule(main, Number(select.value));
    let width = window.innerWidth;
    window.addEventListener("resize", () => {
      if (window.innerWidth !== width) {
        width = window.innerWidth;
        refresh(main);
      }
    });
  }

  document.addEventListener("DOMContentLoaded", start);
  return { fmt, classPart, pick, fill, refresh };
})();
