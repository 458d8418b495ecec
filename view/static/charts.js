// Kapok console charts: small SVG line and bar charts with labelled axes and units.
//
// KapokCharts.draw(container, spec), where container has data-chart="line" or "bars":
//   line: {x: [numbers or labels], xfmt: "time"|"day"|"", unit: "msg/s", series: [{name, values}]}
//   bars: {categories: [labels], unit: "ms", series: [{name, values}]}  (grouped bars)
// The SVG is as wide as its container (redrawn on refresh and on resize) and says what it
// shows in its aria-label; a legend names every series.
"use strict";

const KapokCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f6fde", "#e07b1f", "#2a9d5b", "#c0392b", "#8e44ad", "#16a2b8", "#7f8c8d", "#b8860b"];
  const HEIGHT = 240;
  const PAD = { left: 64, right: 16, top: 16, bottom: 40 };

  function node(name, attrs, parent) {
    const el = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    if (parent) parent.appendChild(el);
    return el;
  }

  function text(parent, x, y, label, attrs) {
    const el = node("text", { x, y, ...attrs }, parent);
    el.textContent = label;
    return el;
  }

  // A round upper bound and tick step for the y axis (1, 2, 5 × 10^n).
  function scale(max) {
    if (!(max > 0)) return { top: 1, step: 0.25 };
    const raw = max / 4;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    return { top: Math.ceil(max / step) * step, step };
  }

  function tickLabel(v) {
    if (v >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
    if (v >= 1e4) return `${+(v / 1e3).toFixed(1)}k`;
    return `${+v.toFixed(2)}`;
  }

  function xLabel(v, kind) {
    if (kind === "time") return new Date(v * 1000).toISOString().slice(11, 16);
    if (kind === "day") return String(v).slice(5);
    return String(v);
  }

  // Axes, unit and legend; null (after saying so in the chart) when there are no points.
  function frame(container, spec, kind, points) {
    container.replaceChildren();
    const width = Math.max(container.clientWidth || 320, 280);
    const names = spec.series.map((s) => s.name).join(", ");
    const svg = node("svg", {
      viewBox: `0 0 ${width} ${HEIGHT}`, width, height: HEIGHT, role: "img",
      "aria-label": `${kind} chart of ${names} in ${spec.unit}`,
    }, container);
    const plot = { x0: PAD.left, x1: width - PAD.right, y0: HEIGHT - PAD.bottom, y1: PAD.top };
    const max = Math.max(0, ...spec.series.flatMap((s) => s.values.filter((v) => typeof v === "number")));
    const { top, step } = scale(max);
    const y = (v) => plot.y0 - (v / top) * (plot.y0 - plot.y1);
    for (let v = 0; v <= top + step / 2; v += step) {
      node("line", { x1: plot.x0, x2: plot.x1, y1: y(v), y2: y(v), class: v === 0 ? "axis" : "gridline" }, svg);
      text(svg, plot.x0 - 6, y(v) + 4, tickLabel(v), { "text-anchor": "end", class: "tick" });
    }
    const unit = text(svg, 12, (plot.y0 + plot.y1) / 2, spec.unit, { class: "unit", "text-anchor": "middle" });
    unit.setAttribute("transform", `rotate(-90 12 ${(plot.y0 + plot.y1) / 2})`);
    const legend = document.createElement("ul");
    legend.className = "legend";
    spec.series.forEach((s, i) => {
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = `swatch c${i % COLORS.length}`;
      item.append(swatch, document.createTextNode(s.name));
      legend.appendChild(item);
    });
    container.appendChild(legend);
    if (points === 0) {
      text(svg, (plot.x0 + plot.x1) / 2, (plot.y0 + plot.y1) / 2, "no data yet", { "text-anchor": "middle", class: "tick" });
      return null;
    }
    return { svg, plot, y };
  }

  function line(container, spec) {
    const n = spec.x.length;
    const drawn = frame(container, spec, "line", n);
    if (!drawn) return;
    const { svg, plot, y } = drawn;
    const x = (i) => (n === 1 ? (plot.x0 + plot.x1) / 2 : plot.x0 + (i / (n - 1)) * (plot.x1 - plot.x0));
    const every = Math.max(1, Math.ceil(n / Math.max(2, Math.floor((plot.x1 - plot.x0) / 70))));
    for (let i = 0; i < n; i += every) {
      text(svg, x(i), plot.y0 + 16, xLabel(spec.x[i], spec.xfmt), { "text-anchor": "middle", class: "tick" });
    }
    if (spec.xfmt === "time" || spec.xfmt === "day") {
      text(svg, (plot.x0 + plot.x1) / 2, HEIGHT - 6, spec.xfmt === "time" ? "time (UTC)" : "day (UTC)",
        { "text-anchor": "middle", class: "unit" });
    }
    spec.series.forEach((s, i) => {
      const points = s.values.map((v, j) => `${x(j).toFixed(1)},${y(v || 0).toFixed(1)}`).join(" ");
      node("polyline", { points, class: `series c${i % COLORS.length}` }, svg);
      if (n <= 31) {
        s.values.forEach((v, j) => {
          const dot = node("circle", { cx: x(j), cy: y(v || 0), r: 3, class: `dot c${i % COLORS.length}` }, svg);
          node("title", {}, dot).textContent = `${s.name} ${xLabel(spec.x[j], spec.xfmt)}: ${v} ${spec.unit}`;
        });
      }
    });
  }

  function bars(container, spec) {
    const groups = spec.categories.length;
    const drawn = frame(container, spec, "bar", groups);
    if (!drawn) return;
    const { svg, plot, y } = drawn;
    const band = (plot.x1 - plot.x0) / groups;
    const barW = Math.min(40, Math.max(2, (band * 0.8) / spec.series.length));
    spec.categories.forEach((cat, g) => {
      const left = plot.x0 + g * band + (band - barW * spec.series.length) / 2;
      text(svg, plot.x0 + g * band + band / 2, plot.y0 + 16, String(cat), { "text-anchor": "middle", class: "tick" });
      spec.series.forEach((s, i) => {
        const v = s.values[g] || 0;
        const rect = node("rect", {
          x: left + i * barW, y: y(v), width: barW - 1, height: Math.max(0, plot.y0 - y(v)),
          class: `bar c${i % COLORS.length}`,
        }, svg);
        node("title", {}, rect).textContent = `${cat} ${s.name}: ${v} ${spec.unit}`;
      });
    });
  }

  function draw(container, spec) {
    if (!spec || !Array.isArray(spec.series)) return;
    if (container.dataset.chart === "bars") bars(container, spec);
    else line(container, spec);
  }

  return { draw, COLORS };
})();
