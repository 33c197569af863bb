// tokenpath UI: small inline-SVG charts and formatting helpers. No libraries.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

// Colours per stage group (the group comes from /api/stages).
const GROUP_COLOURS = {
  client: "#64748b",
  gateway: "#2563eb",
  engine: "#b45309",
  gpu: "#7c3aed",
  network: "#047857",
};
const PHASE_COLOURS = { prefill: "#c2410c", decode: "#0e7490", kv_transfer: "#7c3aed" };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function svgEl(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// --- formatting -------------------------------------------------------------------------

const DASH = "—";

function isNum(v) {
  return typeof v === "number" && Number.isFinite(v);
}

function fmtSeconds(v) {
  if (!isNum(v)) return DASH;
  if (v === 0) return "0 s";
  if (Math.abs(v) < 1e-3) return `${(v * 1e6).toFixed(0)} µs`;
  if (Math.abs(v) < 1) return `${(v * 1e3).toFixed(v < 0.01 ? 2 : 1)} ms`;
  return `${v.toFixed(2)} s`;
}

function fmtDollars(v) {
  if (!isNum(v)) return DASH;
  if (v === 0) return "$0";
  const a = Math.abs(v);
  if (a >= 100) return `$${v.toFixed(0)}`;
  if (a >= 1) return `$${v.toFixed(2)}`;
  if (a >= 0.01) return `$${v.toFixed(4)}`;
  if (a >= 1e-4) return `$${v.toFixed(6).replace(/0+$/, "")}`;
  return `$${v.toExponential(2)}`;
}

function fmtPct(v, digits = 1) {
  return isNum(v) ? `${(v * 100).toFixed(digits)}%` : DASH;
}

function fmtNum(v, digits = 0) {
  if (!isNum(v)) return DASH;
  return v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

function fmtTime(unix) {
  if (!isNum(unix) || unix <= 0) return DASH;
  return new Date(unix * 1000).toLocaleTimeString("en-GB", { hour12: false });
}

// --- charts -----------------------------------------------------------------------------

// Horizontal bars: rows [{label, value, colour, note}], value formatted by fmt.
function barChart(rows, { fmt = String, title = "", width = 560, barHeight = 20 } = {}) {
  const labelWidth = 170;
  const valueWidth = 160;
  const plot = width - labelWidth - valueWidth;
  const max = Math.max(0, ...rows.map((r) => (isNum(r.value) ? r.value : 0)));
  const height = rows.length * (barHeight + 6) + 6;
  const svg = svgEl("svg", {
    class: "chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": title,
  }, svgEl("title", { text: title }));
  rows.forEach((row, i) => {
    const y = 6 + i * (barHeight + 6);
    const w = max > 0 && isNum(row.value) ? Math.max(1, (row.value / max) * plot) : 0;
    svg.append(
      svgEl("text", { x: labelWidth - 8, y: y + barHeight * 0.7, class: "axis-label",
                      "text-anchor": "end", text: row.label }),
      svgEl("rect", { x: labelWidth, y, width: w, height: barHeight, rx: 3,
                      fill: row.colour || "#2563eb",
                      class: row.note === "modeled" ? "modeled" : null }),
      svgEl("text", { x: labelWidth + w + 6, y: y + barHeight * 0.7, class: "value-label",
                      text: fmt(row.value) + (row.note ? ` · ${row.note}` : "") }),
    );
  });
  return svg;
}

// A line over time: points [{t, v}] (v may be null: a gap), y in [yMin, yMax].
function lineChart(points, { fmtY = String, title = "", width = 560, height = 200,
                             yMin = 0, yMax = null, colour = "#2563eb" } = {}) {
  const pad = { left: 56, right: 16, top: 14, bottom: 28 };
  const values = points.map((p) => p.v).filter(isNum);
  const top = yMax ?? Math.max(1e-12, ...values) * 1.1;
  const t0 = points.length ? points[0].t : 0;
  const t1 = points.length ? points[points.length - 1].t : 1;
  const x = (t) => pad.left + (t1 > t0 ? ((t - t0) / (t1 - t0)) : 0.5)
    * (width - pad.left - pad.right);
  const y = (v) => pad.top + (1 - (v - yMin) / (top - yMin || 1))
    * (height - pad.top - pad.bottom);
  const svg = svgEl("svg", {
    class: "chart wide", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": title,
  }, svgEl("title", { text: title }));
  for (const frac of [0, 0.5, 1]) {
    const v = yMin + frac * (top - yMin);
    svg.append(
      svgEl("line", { x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), class: "grid" }),
      svgEl("text", { x: pad.left - 6, y: y(v) + 4, "text-anchor": "end", class: "axis-label",
                      text: fmtY(v) }),
    );
  }
  svg.append(
    svgEl("text", { x: pad.left, y: height - 8, class: "axis-label", text: fmtTime(t0) }),
    svgEl("text", { x: width - pad.right, y: height - 8, "text-anchor": "end",
                    class: "axis-label", text: fmtTime(t1) }),
  );
  let d = "";
  let pen = false;
  for (const p of points) {
    if (!isNum(p.v)) { pen = false; continue; }
    d += `${pen ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)} `;
    pen = true;
  }
  if (d) svg.append(svgEl("path", { d, fill: "none", stroke: colour, "stroke-width": 2.5 }));
  for (const p of points) {
    if (isNum(p.v)) {
      svg.append(svgEl("circle", { cx: x(p.t), cy: y(p.v), r: 3, fill: colour },
                       svgEl("title", { text: `${fmtTime(p.t)}: ${fmtY(p.v)}` })));
    }
  }
  if (!values.length) {
    svg.append(svgEl("text", { x: width / 2, y: height / 2, "text-anchor": "middle",
                               class: "axis-label", text: "no data yet" }));
  }
  return svg;
}

// One waterfall bar: [offset, offset+width] of total, split into segments [{w, colour}].
function waterfallBar(offset, segments, total, { width = 360, height = 18, modeled = false,
                                                   label = "" } = {}) {
  const scale = total > 0 ? width / total : 0;
  const svg = svgEl("svg", { class: "wf-bar", viewBox: `0 0 ${width} ${height}`, width, height,
                             role: "img", "aria-label": label });
  svg.append(svgEl("rect", { x: 0, y: height / 2 - 0.5, width, height: 1, class: "wf-track" }));
  let x = offset * scale;
  for (const seg of segments) {
    const w = Math.max(seg.w > 0 ? 2 : 0, seg.w * scale);
    svg.append(svgEl("rect", { x: Math.min(x, width - w), y: 2, width: w, height: height - 4,
                               rx: 2, fill: seg.colour }));
    if (modeled && w > 0) {
      svg.append(svgEl("rect", { x: Math.min(x, width - w), y: 2, width: w, height: height - 4,
                                 rx: 2, fill: "url(#modeled-hatch)" }));
    }
    x += seg.w * scale;
  }
  return svg;
}

// A single stacked horizontal bar with a legend: parts [{label, value, colour}].
function stackedBar(parts, { fmt = String, title = "", width = 560, height = 26 } = {}) {
  const total = parts.reduce((s, p) => s + (isNum(p.value) ? p.value : 0), 0);
  const svg = svgEl("svg", { class: "chart", viewBox: `0 0 ${width} ${height + 24}`, width,
                             height: height + 24, role: "img", "aria-label": title },
                    svgEl("title", { text: title }));
  let x = 0;
  let legendX = 0;
  for (const part of parts) {
    const w = total > 0 && isNum(part.value) ? (part.value / total) * width : 0;
    svg.append(svgEl("rect", { x, y: 0, width: w, height, fill: part.colour }));
    x += w;
    const text = `${part.label}: ${fmt(part.value)} (${fmtPct(total ? part.value / total : null, 0)})`;
    svg.append(
      svgEl("rect", { x: legendX, y: height + 8, width: 12, height: 12, fill: part.colour }),
      svgEl("text", { x: legendX + 16, y: height + 19, class: "axis-label", text }),
    );
    legendX += 16 + text.length * 6.6 + 18;
  }
  return svg;
}

window.tp = {
  el, svgEl, fmtSeconds, fmtDollars, fmtPct, fmtNum, fmtTime, isNum, DASH,
  barChart, lineChart, waterfallBar, stackedBar, GROUP_COLOURS, PHASE_COLOURS,
};
