// Kapok console charts: small SVG line and bar charts with labelled axes and units.
//
// KapokCharts.draw(container, spec), where container has data-chart="line" or "bars":
//   line: {x: [numbers or labels], xfmt: "time"|"day"|"", unit: "msg/s", series: [{name, values}]}
//   bars: {categories: [labels], unit: "ms", series: [{name, values}]}  (grouped bars)
// The SVG is as wide as its container (redrawn on refresh and on resize) and says what it
// shows in its aria-label; a legend names every series.
//
// Series colours never repeat within a chart: up to eight series take the fixed COLORS, in
// order; more take palette(n), n hues evenly spaced around the OKLCH circle with two
// alternating lightnesses, each dark enough for 3:1 contrast on the white card. A series
// keeps its colour across refreshes and reloads as long as the set of series does (the
// server sends them in a stable order: topics sorted by name). Colours are set through
// the element's style object, which the page's CSP (style-src 'self') allows.
"use strict";

const KapokCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f6fde", "#d9731a", "#2a9d5b", "#c0392b", "#8e44ad", "#16a2b8", "#7f8c8d", "#b8860b"];
  const LIGHTNESS = [0.5, 0.62]; // OKLCH L: ≥ 3:1 against white at full chroma
  const CHROMA = 0.14;
  const FIRST_HUE = 264; // the hue of COLORS[0], so a grown palette starts where the fixed one does

  // OKLCH -> sRGB channel values in [0, 1] (may fall outside: out of gamut).
  function oklchToRgb(l, c, hDeg) {
    const h = (hDeg * Math.PI) / 180;
    const a = c * Math.cos(h);
    const b = c * Math.sin(h);
    const l_ = (l + 0.3963377774 * a + 0.2158037573 * b) ** 3;
    const m_ = (l - 0.1055613458 * a - 0.0638541728 * b) ** 3;
    const s_ = (l - 0.0894841775 * a - 1.291485548 * b) ** 3;
    const linear = [
      4.0767416621 * l_ - 3.3077115913 * m_ + 0.2309699292 * s_,
      -1.2684380046 * l_ + 2.6097574011 * m_ - 0.3413193965 * s_,
      -0.0041960863 * l_ - 0.7034186147 * m_ + 1.707614701 * s_,
    ];
    return linear.map((v) => (v <= 0.0031308 ? 12.92 * v : 1.055 * v ** (1 / 2.4) - 0.055));
  }

  // The colour of that hue and lightness with the most chroma (up to CHROMA) sRGB can show.
  function oklchHex(l, hue) {
    let rgb = oklchToRgb(l, CHROMA, hue);
    for (let c = CHROMA; c > 0 && rgb.some((v) => v < 0 || v > 1); c -= 0.005) rgb = oklchToRgb(l, c, hue);
    const byte = (v) => Math.round(Math.min(1, Math.max(0, v)) * 255).toString(16).padStart(2, "0");
    return `#${rgb.map(byte).join("")}`;
  }

  // n distinct series colours (past a few dozen, hues that close would round to the same
  // colour: such a one is made a little darker, which only adds contrast).
  function palette(n) {
    if (n <= COLORS.length) return COLORS.slice(0, n);
    const seen = new Set();
    return Array.from({ length: n }, (_, i) => {
      const hue = (FIRST_HUE + (360 * i) / n) % 360;
      let lightness = LIGHTNESS[i % 2];
      let hex = oklchHex(lightness, hue);
      while (seen.has(hex) && lightness > 0.2) {
        lightness -= 0.004;
        hex = oklchHex(lightness, hue);
      }
      seen.add(hex);
      return hex;
    });
  }

  function paint(el, color, ...props) {
    for (const prop of props) el.style[prop] = color;
  }
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
    const colors = palette(spec.series.length);
    spec.series.forEach((s, i) => {
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      paint(swatch, colors[i], "background");
      item.append(swatch, document.createTextNode(s.name));
      legend.appendChild(item);
    });
    container.appendChild(legend);
    if (points === 0) {
      text(svg, (plot.x0 + plot.x1) / 2, (plot.y0 + plot.y1) / 2, "no data yet", { "text-anchor": "middle", class: "tick" });
      return null;
    }
    return { svg, plot, y, colors };
  }

  function line(container, spec) {
    const n = spec.x.length;
    const drawn = frame(container, spec, "line", n);
    if (!drawn) return;
    const { svg, plot, y, colors } = drawn;
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
      paint(node("polyline", { points, class: "series" }, svg), colors[i], "stroke");
      if (n <= 31) {
        s.values.forEach((v, j) => {
          const dot = node("circle", { cx: x(j), cy: y(v || 0), r: 3, class: "dot" }, svg);
          paint(dot, colors[i], "fill");
          node("title", {}, dot).textContent = `${s.name} ${xLabel(spec.x[j], spec.xfmt)}: ${v} ${spec.unit}`;
        });
      }
    });
  }

  function bars(container, spec) {
    const groups = spec.categories.length;
    const drawn = frame(container, spec, "bar", groups);
    if (!drawn) return;
    const { svg, plot, y, colors } = drawn;
    const band = (plot.x1 - plot.x0) / groups;
    const barW = Math.min(40, Math.max(2, (band * 0.8) / spec.series.length));
    const every = Math.max(1, Math.ceil(groups / Math.max(2, Math.floor((plot.x1 - plot.x0) / 70))));
    spec.categories.forEach((cat, g) => {
      const left = plot.x0 + g * band + (band - barW * spec.series.length) / 2;
      if (g % every === 0) {
        text(svg, plot.x0 + g * band + band / 2, plot.y0 + 16, String(cat), { "text-anchor": "middle", class: "tick" });
      }
      spec.series.forEach((s, i) => {
        const v = s.values[g] || 0;
        const rect = node("rect", {
          x: left + i * barW, y: y(v), width: barW - 1, height: Math.max(0, plot.y0 - y(v)),
          class: "bar",
        }, svg);
        paint(rect, colors[i], "fill");
        node("title", {}, rect).textContent = `${cat} ${s.name}: ${v} ${spec.unit}`;
      });
    });
  }

  function draw(container, spec) {
    if (!spec || !Array.isArray(spec.series)) return;
    if (container.dataset.chart === "bars") bars(container, spec);
    else line(container, spec);
  }

  return { draw, palette, COLORS };
})();
