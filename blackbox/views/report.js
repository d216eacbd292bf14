// blackbox report: draws the page's data (the JSON block #blackbox-data) as SVG. Hand-written, no library.
// Every text from a ring goes into the page as a text node (textContent), never as markup.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const data = JSON.parse(document.getElementById("blackbox-data").textContent);
  const PANELS = { job: "the job's processes", cgroup: "memory cgroup", gpu: "GPU memory" };
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
    "#7f7f7f", "#d62728"];
  const FIT = 1.5; // a limit is drawn on a panel when within this many times its highest line

  function el(tag, attrs, text, ns) {
    const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs, text) { return el(tag, attrs, text, SVG); }

  function bytes(n) {
    if (n === null || n === undefined || !isFinite(n)) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = Math.abs(n), i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (n < 0 ? "-" : "") + (i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + " " + units[i];
  }
  function secs(t) { return Math.abs(t) < 100 ? t.toFixed(2) + " s" : Math.abs(t) < 7200 ? (t / 60).toFixed(1) + " min" : (t / 3600).toFixed(2) + " h"; }

  function ticks(lo, hi, n) {
    const span = hi - lo;
    if (!(span > 0)) return [lo];
    const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => span / s <= n) || 10 * mag;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push(v);
    return out;
  }
  function byteTicks(hi, n) {
    let unit = 1;
    while (hi / unit >= 1024 && unit < Math.pow(1024, 4)) unit *= 1024;
    return ticks(0, hi / unit, n).map(v => v * unit);
  }
  // The index of the last point at or before t (binary search); -1 before the first.
  function before(ts, t) {
    let lo = 0, hi = ts.length - 1, found = -1;
    while (lo <= hi) { const mid = (lo + hi) >> 1; if (ts[mid] <= t) { found = mid; lo = mid + 1; } else hi = mid - 1; }
    return found;
  }

  // ------------------------------------------------------------------ the memory timeline
  const tl = data.timeline;
  const hidden = new Set();
  let view = [0, Math.max(tl.end, 1e-3)];
  const listeners = [];

  function drawTimeline() {
    const host = document.getElementById("timeline");
    host.textContent = "";
    const panels = Object.keys(PANELS).filter(p => tl.series.some(s => s.panel === p));
    if (!panels.length) { host.appendChild(el("p", { class: "note" }, "No memory sample survived.")); return; }
    if (tl.processes > tl.drawn) host.appendChild(el("p", { class: "note" },
      tl.drawn + " of " + tl.processes + " processes drawn (the first death's, then the lowest ranks)."));
    const width = Math.max(480, host.clientWidth || 900), left = 72, right = 16, plotW = width - left - right;
    const x = t => left + (t - view[0]) / (view[1] - view[0]) * plotW;
    const tip = el("div", { class: "tip", id: "timeline-tip" });
    const charts = [];
    let colorIndex = 0;
    const colorOf = {};
    for (const s of tl.series) colorOf[s.name] = s.panel === "cgroup" ? ["#555", "#888", "#999"][colorIndex % 3] : COLORS[colorIndex++ % COLORS.length];
    panels.forEach((panel, pi) => {
      const top = pi === 0 ? 24 : 8, height = panel === "job" ? 220 : 150, h = top + height + 26;
      const chart = svg("svg", { width: width, height: h, class: "panel", "data-panel": panel, role: "img" });
      chart.appendChild(svg("title", {}, PANELS[panel]));
      const lines = tl.series.filter(s => s.panel === panel && !hidden.has(s.name));
      let peak = 0;
      for (const s of lines) for (let i = 0; i < s.t.length; i++) if (s.t[i] >= view[0] && s.t[i] <= view[1] && s.v[i] > peak) peak = s.v[i];
      const limits = tl.limits.filter(l => l.panel === panel);
      for (const l of limits) if (l.value <= FIT * peak || !peak) peak = Math.max(peak, l.value);
      const yMax = (peak || 1) * 1.1, y = v => top + height - v / yMax * height;
      const clip = "clip-" + panel;
      const defs = svg("defs");
      const cp = svg("clipPath", { id: clip });
      cp.appendChild(svg("rect", { x: left, y: top, width: plotW, height: height }));
      defs.appendChild(cp); chart.appendChild(defs);
      for (const v of byteTicks(yMax, 4)) {
        chart.appendChild(svg("line", { x1: left, x2: left + plotW, y1: y(v), y2: y(v), class: "grid" }));
        chart.appendChild(svg("text", { x: left - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, bytes(v)));
      }
      for (const t of ticks(view[0], view[1], 8)) {
        chart.appendChild(svg("line", { x1: x(t), x2: x(t), y1: top, y2: top + height, class: "grid" }));
        chart.appendChild(svg("text", { x: x(t), y: top + height + 16, class: "axis", "text-anchor": "middle" }, secs(t)));
      }
      const g = svg("g", { "clip-path": "url(#" + clip + ")" });
      for (const l of limits) if (l.value <= FIT * (peak || l.value)) {
        g.appendChild(svg("line", { x1: left, x2: left + plotW, y1: y(l.value), y2: y(l.value), class: "limit" }));
      }
      for (const s of lines) {
        let d = "";
        for (let i = 0; i < s.t.length; i++) d += (i ? "L" : "M") + x(s.t[i]).toFixed(1) + " " + y(s.v[i]).toFixed(1);
        const path = svg("path", { d: d, class: "series", stroke: colorOf[s.name], "data-name": s.name });
        if (s.dash) path.setAttribute("stroke-dasharray", s.dash);
        g.appendChild(path);
      }
      for (const t of tl.ooms) g.appendChild(svg("line", { x1: x(t), x2: x(t), y1: top, y2: top + height, class: "oom" }));
      for (const a of (tl.alerts || []).filter(a => a.panel === panel)) {
        const line = svg("line", { x1: x(a.t), x2: x(a.t), y1: top, y2: top + height, class: "alert " + a.level });
        line.appendChild(svg("title", {}, a.text));
        g.appendChild(line);
      }
      for (const d of tl.deaths) {
        g.appendChild(svg("line", { x1: x(d.t), x2: x(d.t), y1: top, y2: top + height, class: d.first ? "death first" : "death" }));
      }
      chart.appendChild(g);
      if (pi === 0) drawMarks(chart, x, top, left, plotW);
      const cursor = svg("line", { x1: 0, x2: 0, y1: top, y2: top + height, class: "cursor", visibility: "hidden" });
      const brush = svg("rect", { x: 0, y: top, width: 0, height: height, class: "brush", visibility: "hidden" });
      chart.appendChild(cursor); chart.appendChild(brush);
      host.appendChild(el("h3", { class: "panel-name" }, PANELS[panel]));
      host.appendChild(chart);
      host.appendChild(legend(panel, limits, peak, colorOf));
      charts.push({ chart, cursor, brush, lines, top, height });
    });
    host.appendChild(tip);
    interact(host, charts, x, left, plotW, tip);
  }

  function drawMarks(chart, x, top, left, plotW) {
    let last = -1e9;
    for (const [t, n] of tl.steps) {
      if (t < view[0] || t > view[1] || x(t) - last < 56) continue;
      last = x(t);
      chart.appendChild(svg("line", { x1: x(t), x2: x(t), y1: top - 4, y2: top, class: "axis-line" }));
      chart.appendChild(svg("text", { x: x(t), y: top - 7, class: "axis step", "text-anchor": "middle" }, n));
    }
    if (tl.steps.length) chart.appendChild(svg("text", { x: left + plotW, y: 10, class: "axis", "text-anchor": "end" }, "step"));
    const first = tl.deaths.find(d => d.first);
    if (first && first.t >= view[0] - 1e-3 && first.t <= view[1] + 1e-3) {
      chart.appendChild(svg("text", { x: x(first.t) - 4, y: top + 14, class: "death-label", "text-anchor": "end" },
        first.who + " " + first.cause));
    }
  }

  function legend(panel, limits, peak, colorOf) {
    const ul = el("ul", { class: "legend" });
    for (const s of tl.series.filter(s => s.panel === panel)) {
      const li = el("li", { class: hidden.has(s.name) ? "off" : "", tabindex: 0 });
      const swatch = el("span", { class: "swatch" + (s.dash ? " dashed" : "") });
      swatch.style.borderColor = colorOf[s.name];
      li.appendChild(swatch);
      li.appendChild(document.createTextNode(s.name + " " + bytes(s.v[0]) + " \u2192 " + bytes(s.v[s.v.length - 1])));
      li.addEventListener("click", () => { hidden.has(s.name) ? hidden.delete(s.name) : hidden.add(s.name); drawTimeline(); });
      ul.appendChild(li);
    }
    for (const l of limits) {
      const li = el("li", { class: "limit-entry" }, l.name + " " + bytes(l.value) + (l.value > FIT * peak && peak ? " (above the lines, not drawn)" : ""));
      ul.appendChild(li);
    }
    const said = (tl.alerts || []).filter(a => a.panel === panel);
    if (said.length) ul.appendChild(el("li", { class: "alert-entry" }, "alerts: " + said.length + ", first at " + secs(said[0].t) + ": " + said[0].text));
    const deaths = tl.deaths.filter(d => d.first);
    if (panel === "job" && deaths.length) ul.appendChild(el("li", { class: "death-entry" }, "death: " + deaths[0].who + " " + deaths[0].cause));
    return ul;
  }

  function stepAt(t) {
    const i = before(tl.steps.map(s => s[0]), t);
    return i < 0 ? null : tl.steps[i][1];
  }

  function interact(host, charts, x, left, plotW, tip) {
    const tOf = px => view[0] + (px - left) / plotW * (view[1] - view[0]);
    let start = null;
    for (const c of charts) {
      const local = ev => ev.clientX - c.chart.getBoundingClientRect().left;
      c.chart.addEventListener("mousemove", ev => {
        const px = Math.min(left + plotW, Math.max(left, local(ev))), t = tOf(px);
        for (const o of charts) { o.cursor.setAttribute("x1", px); o.cursor.setAttribute("x2", px); o.cursor.setAttribute("visibility", "visible"); }
        tip.textContent = "";
        const step = stepAt(t);
        tip.appendChild(el("div", { class: "tip-head" }, secs(t) + (step === null ? "" : ", step " + step)));
        for (const o of charts) for (const s of o.lines) {
          const i = before(s.t, t);
          if (i >= 0) tip.appendChild(el("div", {}, s.name + ": " + bytes(s.v[i])));
        }
        tip.style.left = Math.min(px + 14, host.clientWidth - 260) + "px";
        tip.style.top = (c.chart.offsetTop + 10) + "px";
        tip.style.display = "block";
        if (start !== null) {
          const a = Math.min(start, px), b = Math.max(start, px);
          for (const o of charts) { o.brush.setAttribute("x", a); o.brush.setAttribute("width", b - a); o.brush.setAttribute("visibility", "visible"); }
        }
      });
      c.chart.addEventListener("mouseleave", () => { tip.style.display = "none"; for (const o of charts) o.cursor.setAttribute("visibility", "hidden"); });
      c.chart.addEventListener("mousedown", ev => { start = Math.min(left + plotW, Math.max(left, local(ev))); ev.preventDefault(); });
      c.chart.addEventListener("mouseup", ev => {
        if (start === null) return;
        const end = Math.min(left + plotW, Math.max(left, local(ev))), from = start;
        const a = tOf(Math.min(from, end)), b = tOf(Math.max(from, end));
        start = null;
        if (Math.abs(end - from) > 4 && b - a > 1e-6) setView([a, b]);
        else for (const o of charts) o.brush.setAttribute("visibility", "hidden");
      });
      c.chart.addEventListener("dblclick", () => setView([0, Math.max(tl.end, 1e-3)]));
    }
  }

  function setView(v) {
    view = v;
    drawTimeline();
    for (const f of listeners) f(view);
  }

  // ------------------------------------------------------------------ flame graphs
  // As views/speedscope.py's function_frame: no line number, the path from its package, else the base name.
  function byFunction(frame) {
    const m = /^(.*) \((.*):\d+\)$/.exec(frame);
    if (!m) return frame;
    const root = /^.*\/(?:site-packages|dist-packages|lib\/python\d+(?:\.\d+)?t?)\//.exec(m[2]);
    return m[1] + " (" + (root ? m[2].slice(root[0].length) : m[2].split("/").pop()) + ")";
  }

  function buildTree(entries, fold) {
    const root = { name: "all", value: 0, children: new Map() };
    for (const [stack, weight] of entries) {
      if (!(weight > 0)) continue;
      root.value += weight;
      let node = root;
      for (const raw of stack.split(";")) {
        const name = fold ? byFunction(raw) : raw;
        let child = node.children.get(name);
        if (!child) { child = { name: name, value: 0, children: new Map(), parent: node }; node.children.set(name, child); }
        child.value += weight;
        node = child;
      }
    }
    return root;
  }

  function hue(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    const fn = name.split(" (")[0];
    if ((fn.startsWith("<") && !name.includes(" (")) || /^(rank|pid|worker|main|child|process) /.test(name)) return "#c8c8c8";
    return "hsl(" + (10 + h % 45) + ", " + (70 + h % 25) + "%, " + (58 + (h >> 5) % 14) + "%)";
  }

  function flameGraph(host, unit, getEntries, options) {
    const controls = el("div", { class: "flame-controls" });
    const foldBox = el("input", { type: "checkbox", id: host.id + "-fold" });
    const foldLabel = el("label", { for: host.id + "-fold" }, " one box per function (no line numbers)");
    const search = el("input", { type: "search", placeholder: "highlight frames matching\u2026", class: "search" });
    const reset = el("button", { type: "button" }, "reset zoom");
    const status = el("span", { class: "flame-status" });
    controls.append(foldBox, foldLabel, search, reset, status);
    const area = el("div", { class: "flame-area" });
    const tip = el("div", { class: "tip" });
    host.textContent = "";
    host.append(controls, area, tip);
    let focus = [];
    const fmt = v => unit === "bytes" ? bytes(v) : v + " sample" + (v === 1 ? "" : "s");

    function draw() {
      const root = buildTree(getEntries(), foldBox.checked);
      area.textContent = "";
      status.textContent = options.describe ? options.describe(root) : "";
      if (!root.value) { area.appendChild(el("p", { class: "note" }, options.empty)); return; }
      let node = root;
      const path = [root];
      for (const name of focus) { const c = node.children.get(name); if (!c) break; node = c; path.push(c); }
      const width = Math.max(480, host.clientWidth || 900), row = 18;
      const rows = [];
      const depthOf = (n, d) => { rows[d] = true; for (const c of n.children.values()) depthOf(c, d + 1); };
      depthOf(node, path.length - 1);
      const chart = svg("svg", { width: width, height: rows.length * row + 2, class: "flame-svg" });
      const term = search.value.trim().toLowerCase();
      function box(n, x0, w, depth, ancestor) {
        if (w < 0.5) return;
        const g = svg("g", { class: "frame" + (ancestor ? " ancestor" : "") });
        const match = term && n.name.toLowerCase().includes(term);
        g.appendChild(svg("rect", { x: x0, y: depth * row, width: Math.max(0, w - 0.5), height: row - 1, fill: match ? "#d946ef" : hue(n.name), rx: 1 }));
        const chars = Math.floor((w - 6) / 6.6);
        if (chars >= 3) g.appendChild(svg("text", { x: x0 + 3, y: depth * row + 13 }, n.name.length > chars ? n.name.slice(0, chars - 1) + "\u2026" : n.name));
        g.addEventListener("mousemove", ev => {
          tip.textContent = "";
          tip.appendChild(el("div", { class: "tip-head" }, n.name));
          tip.appendChild(el("div", {}, fmt(n.value) + ", " + (100 * n.value / root.value).toFixed(1) + "% of all"));
          const r = host.getBoundingClientRect();
          tip.style.left = Math.min(ev.clientX - r.left + 12, width - 320) + "px";
          tip.style.top = (ev.clientY - r.top + 14) + "px";
          tip.style.display = "block";
        });
        g.addEventListener("mouseleave", () => { tip.style.display = "none"; });
        g.addEventListener("click", () => {
          const names = [];
          for (let p = n; p && p !== root; p = p.parent) names.unshift(p.name);
          focus = names;
          draw();
        });
        chart.appendChild(g);
        if (ancestor) return;
        let x = x0;
        const kids = [...n.children.values()].sort((a, b) => b.value - a.value);
        for (const c of kids) { const cw = w * c.value / n.value; box(c, x, cw, depth + 1, false); x += cw; }
      }
      path.forEach((p, d) => { if (p !== node) box(p, 0, width, d, true); });
      box(node, 0, width, path.length - 1, false);
      area.appendChild(chart);
    }
    foldBox.addEventListener("change", () => { focus = []; draw(); });
    search.addEventListener("input", draw);
    reset.addEventListener("click", () => { focus = []; draw(); });
    draw();
    return draw;
  }

  // ------------------------------------------------------------------ the sections
  function drawStacks() {
    const st = data.stacks;
    const host = document.getElementById("flame");
    const entries = () => {
      const counts = new Map();
      for (const [t, i] of st.samples) if (t >= view[0] && t <= view[1]) counts.set(i, (counts.get(i) || 0) + 1);
      return [...counts].map(([i, n]) => [st.stacks[i], n]);
    };
    const whole = () => view[0] <= 0 && view[1] >= tl.end;
    const redraw = flameGraph(host, "samples", entries, {
      empty: st.samples.length ? "No stack was sampled in this window." : "No stack samples in this bundle (stack sampling was off).",
      describe: root => root.value + " samples " + (whole() ? "over the whole run" : "from " + secs(view[0]) + " to " + secs(view[1])) +
        (st.dropped ? " (the earliest " + st.dropped + " left out)" : "") +
        (st.unlisted ? " (" + st.unlisted + " of stacks past the page's budget left out)" : ""),
    });
    listeners.push(redraw);
  }

  function drawAllocations() {
    const al = data.allocations;
    if (!al) return;
    const host = document.getElementById("alloc");
    host.textContent = "";
    host.appendChild(el("p", {}, bytes(al.live_bytes) + " \u00b1 " + bytes(al.error_bytes) +
      " (95%) live at the end in sampled allocations, by allocating stack (width is live bytes):"));
    // the import machinery's frames hidden by default (as memray's "hide import frames"): an import's memory
    // then sits under the job's import line, not under ten frames of importlib
    const hide = el("input", { type: "checkbox", id: "alloc-hide-imports" });
    hide.checked = true;
    const label = el("label", {}, " hide import frames");
    label.prepend(hide);
    host.appendChild(label);
    const importFrame = /<frozen importlib\._bootstrap|\/importlib\/_bootstrap(_external)?\.py:/;
    const shownStacks = () => hide.checked
      ? al.stacks.map(([s, n]) => [s.split(";").filter(f => !importFrame.test(f)).join(";") || s, n]) : al.stacks;
    const flame = el("div", { id: "alloc-flame", class: "flame" });
    host.appendChild(flame);
    const redraw = flameGraph(flame, "bytes", shownStacks, { empty: "No sampled allocation was live at the end." });
    hide.addEventListener("change", redraw);
    if (!al.sites.length) return;
    const table = el("table", { class: "sortable sites" });
    const head = el("tr");
    for (const h of ["site", "line", "live", "\u00b1", "since start-up", "growth", "first step", "thread", "process"]) head.appendChild(el("th", {}, h));
    table.appendChild(el("thead")).appendChild(head);
    const body = el("tbody");
    for (const s of al.sites) {
      const tr = el("tr");
      const growth = s.grows === false ? "-"
        : s.growth_per_step !== null && s.growth_per_step !== undefined ? bytes(s.growth_per_step) + "/step"
        : s.growth_per_s !== null && s.growth_per_s !== undefined ? bytes(s.growth_per_s) + "/s" : "-";
      const site = s.imports ? s.site + " (imports)" : s.site;
      for (const v of [site, s.line, bytes(s.live_bytes), bytes(s.error_bytes), bytes(s.resident_bytes), growth, s.first_step, s.thread, s.process]) {
        tr.appendChild(el("td", {}, v === null || v === undefined ? "-" : v));
      }
      body.appendChild(tr);
    }
    table.appendChild(body);
    host.appendChild(table);
  }

  function sortable(table) {
    table.querySelectorAll("th").forEach((th, col) => {
      th.addEventListener("click", () => {
        const body = table.tBodies[0], rows = [...body.rows];
        const down = th.getAttribute("aria-sort") !== "descending";
        table.querySelectorAll("th").forEach(h => h.removeAttribute("aria-sort"));
        th.setAttribute("aria-sort", down ? "descending" : "ascending");
        const key = r => { const c = r.cells[col]; const v = c.getAttribute("data-v"); return v === null ? c.textContent : v; };
        const num = rows.every(r => key(r) === "" || isFinite(Number(key(r))));
        rows.sort((a, b) => {
          const x = key(a), y = key(b);
          if (x === "" || y === "") return x === y ? 0 : x === "" ? 1 : -1;
          const c = num ? Number(x) - Number(y) : x < y ? -1 : x > y ? 1 : 0;
          return down ? -c : c;
        });
        body.append(...rows);
      });
    });
  }

  drawTimeline();
  drawAllocations();
  drawStacks();
  document.querySelectorAll("table.sortable").forEach(sortable);
  let resize = null;
  window.addEventListener("resize", () => { clearTimeout(resize); resize = setTimeout(() => setView(view), 150); });
  document.body.setAttribute("data-drawn", "yes");
})();
