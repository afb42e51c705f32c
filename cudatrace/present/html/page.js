/* cudatrace HTML report: timeline, icicle flame graph and site table, drawn from the JSON
   embedded in the page (id="ct-data"). No library, no network. */
(function () {
"use strict";

var D = JSON.parse(document.getElementById("ct-data").textContent);
var SVGNS = "http://www.w3.org/2000/svg";
var FRAMES = D.frames, STACKS = D.stacks, SITES = D.sites;

// ---- small helpers ------------------------------------------------------------------------

function el(tag, attrs, kids) {
  var e = document.createElement(tag);
  setAttrs(e, attrs);
  (kids || []).forEach(function (k) { if (k != null) e.append(k); });
  return e;
}
function sv(tag, attrs, parent) {
  var e = document.createElementNS(SVGNS, tag);
  setAttrs(e, attrs);
  if (parent) parent.appendChild(e);
  return e;
}
function setAttrs(e, attrs) {
  for (var k in attrs || {}) {
    var v = attrs[k];
    if (v == null || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k === "cls") e.setAttribute("class", v);
    else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
}
function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }

var UNITS = ["KiB", "MiB", "GiB", "TiB", "PiB"];
function fmtBytes(n) {           // the report's format_bytes
  if (n == null) return "-";
  if (n < 0) return "-" + fmtBytes(-n);
  if (n < 1024) return Math.round(n) + " B";
  var v = n / 1024, i = 0;
  while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
  return (v < 10 ? v.toFixed(2) : v.toFixed(1)) + " " + UNITS[i];
}
function signedBytes(n) { return n === 0 ? "0" : (n > 0 ? "+" : "\u2212") + fmtBytes(Math.abs(n)); }
function fmtCount(n) { return (n || 0).toLocaleString("en-US"); }
function pct(x) { return (100 * x).toFixed(x < 0.001 && x > 0 ? 2 : 1) + "%"; }
function timeUnit(t) {
  if (t < 1e-3) return [1e6, "\u00b5s"];
  if (t < 1) return [1e3, "ms"];
  return [1, "s"];
}
// t in seconds; the unit follows `scale` (the largest time shown), the decimals `step`
function fmtTime(t, scale, step) {
  var u = timeUnit(Math.abs(scale == null ? t : scale)), v = t * u[0];
  var dec = Math.abs(v) >= 100 ? 1 : 3;
  if (step) {
    var sv_ = step * u[0];
    for (dec = 0; dec < 6 && Math.abs(Math.round(sv_ * Math.pow(10, dec)) - sv_ * Math.pow(10, dec)) > 1e-6 * Math.pow(10, dec); dec++);
  }
  return v.toFixed(dec) + " " + u[1];
}
function niceStep(span, target) {
  if (!(span > 0)) return 1;
  var raw = span / target, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  var steps = [1, 2, 2.5, 5, 10];
  for (var i = 0; i < steps.length; i++) if (raw <= steps[i] * mag) return steps[i] * mag;
  return 10 * mag;
}
function byteUnit(v) {
  if (v >= 1073741824) return [1073741824, "GiB"];
  if (v >= 1048576) return [1048576, "MiB"];
  if (v >= 1024) return [1024, "KiB"];
  return [1, "B"];
}
function trimNum(v) { return (+v.toFixed(3)).toString(); }
function hash(s) {
  var h = 2166136261;
  for (var i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
  return h >>> 0;
}

var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
               "#ff9da7", "#9c755f"];
var OTHER = "#bab0ac";
var COL = { traced: "#1a56db", tree: "#e8710a", used: "#6b7280", avail: "#15803d",
            rss: "#9333ea", budget: "#dc2626", deny: "#dc2626", fail: "#b45309",
            a: "#8b95a5", b: "#1a56db" };

// ---- the tooltip --------------------------------------------------------------------------

var tip = document.getElementById("tip");
function showTip(ev, nodes) {
  clear(tip);
  nodes.forEach(function (n) { tip.append(typeof n === "string" ? el("div", {text: n}) : n); });
  tip.hidden = false;
  var r = tip.getBoundingClientRect();
  var x = ev.clientX + 14, y = ev.clientY + 14;
  if (x + r.width > window.innerWidth - 8) x = ev.clientX - r.width - 14;
  if (y + r.height > window.innerHeight - 8) y = ev.clientY - r.height - 14;
  tip.style.left = Math.max(4, x) + "px";
  tip.style.top = Math.max(4, y) + "px";
}
function hideTip() { tip.hidden = true; }

// ---- segmented controls -------------------------------------------------------------------

function segmented(label, options, current, onpick) {
  var box = el("div", {cls: "seg"}, [el("span", {cls: "seg-label", text: label})]);
  options.forEach(function (o) {
    box.append(el("button", {type: "button", cls: o[0] === current ? "on" : "", text: o[1],
      "data-value": o[0], onclick: function () {
        box.querySelectorAll("button").forEach(function (b) { b.classList.remove("on"); });
        this.classList.add("on");
        onpick(o[0]);
      }}));
  });
  return box;
}

// ---- the timeline chart -------------------------------------------------------------------
// opts: {lines: [{id, label, color, pts (flat t,v), step, dash, width, dots}], areas:
// {times, layers: [{label, color, values}], end}, budget, markers, peaks: [{t, v, color, label}],
// moments: [t], selected, onpick(i), domain: [x0, x1], full: [x0, x1]}

function Chart(box, legendBox) {
  this.box = box; this.legendBox = legendBox; this.hidden = {}; this.zoom = null;
}
Chart.prototype.draw = function (o) {
  var self = this;
  this.o = o;
  var W = Math.max(this.box.clientWidth, 480), H = 330;
  var ml = 72, mr = 18, mt = 24, mb = 40, pw = W - ml - mr, ph = H - mt - mb;
  var dom = this.zoom || o.domain;
  var x0 = dom[0], x1 = dom[1] > dom[0] ? dom[1] : dom[0] + 1e-3, xs = x1 - x0;
  var lines = o.lines.filter(function (l) { return !self.hidden[l.id]; });
  var vmax = 1;
  function visMax(pts) {
    for (var i = 0; i < pts.length; i += 2) {
      var inside = pts[i] >= x0 && pts[i] <= x1;
      var spans = i + 2 < pts.length && pts[i] < x0 && pts[i + 2] > x0;
      if ((inside || spans) && pts[i + 1] > vmax) vmax = pts[i + 1];
    }
  }
  lines.forEach(function (l) { visMax(l.pts); });
  if (o.areas) o.areas.totals.forEach(function (v, i) {
    var t = o.areas.times[i], t2 = i + 1 < o.areas.times.length ? o.areas.times[i + 1] : o.areas.end;
    if (t2 >= x0 && t <= x1 && v > vmax) vmax = v;
  });
  (o.peaks || []).forEach(function (p) { if (p.v > vmax) vmax = p.v; });
  if (o.budget && !this.hidden.budget && o.budget > vmax) vmax = o.budget;
  var bu = byteUnit(vmax * 1.1), ystep = niceStep(vmax * 1.12 / bu[0], 5);
  var ytop = Math.ceil(vmax * 1.12 / bu[0] / ystep) * ystep * bu[0];
  function X(t) { return ml + (t - x0) / xs * pw; }
  function Y(v) { return mt + ph - v / ytop * ph; }
  this.X = X; this.x0 = x0; this.xs = xs; this.pw = pw; this.ml = ml;

  var svg = sv("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, cls: "chart",
                       role: "img", "aria-label": "live device memory over time"});
  var defs = sv("defs", {}, svg);
  var clip = sv("clipPath", {id: "plotclip"}, defs);
  sv("rect", {x: ml, y: mt - 6, width: pw, height: ph + 6}, clip);
  // grid
  var g = sv("g", {cls: "grid"}, svg);
  for (var k = 0; k * ystep * bu[0] <= ytop + 1e-6; k++) {
    var yv = k * ystep * bu[0];
    sv("line", {x1: ml, x2: ml + pw, y1: Y(yv), y2: Y(yv)}, g);
    sv("text", {x: ml - 8, y: Y(yv) + 4, "text-anchor": "end", cls: "tick", text: trimNum(k * ystep)}, svg);
  }
  var xstep = niceStep(xs, Math.max(3, Math.floor(pw / 110)));
  for (var tx = Math.ceil(x0 / xstep) * xstep; tx <= x1 + 1e-12; tx += xstep) {
    sv("line", {x1: X(tx), x2: X(tx), y1: mt, y2: mt + ph}, g);
    sv("text", {x: X(tx), y: mt + ph + 17, "text-anchor": "middle", cls: "tick",
                text: fmtTime(tx, x1, xstep)}, svg);
  }
  sv("text", {x: ml + pw / 2, y: H - 4, "text-anchor": "middle", cls: "axis-label",
              text: o.xlabel || "time since the run started"}, svg);
  sv("text", {transform: "translate(16 " + (mt + ph / 2) + ") rotate(-90)", "text-anchor": "middle",
              cls: "axis-label", text: "live device memory (" + bu[1] + ")"}, svg);
  var plot = sv("g", {"clip-path": "url(#plotclip)"}, svg);

  // stacked areas, each moment's live set held until the next moment
  if (o.areas) {
    var A = o.areas, n = A.times.length, base = new Array(n).fill(0);
    A.layers.forEach(function (layer) {
      var top = [], bot = [];
      for (var i = 0; i < n; i++) {
        var t = A.times[i], t2 = i + 1 < n ? A.times[i + 1] : A.end;
        var lo = base[i], hi = base[i] + layer.values[i];
        top.push([X(t), Y(hi)], [X(t2), Y(hi)]);
        bot.push([X(t), Y(lo)], [X(t2), Y(lo)]);
        base[i] = hi;
      }
      var d = "M" + top.map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join("L") +
              "L" + bot.reverse().map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join("L") + "Z";
      sv("path", {d: d, fill: layer.color, "fill-opacity": 0.55, stroke: "none", cls: "area"}, plot);
    });
  }
  // lines
  lines.forEach(function (l) {
    var p = l.pts, d = "";
    for (var i = 0; i < p.length; i += 2) {
      var x = X(p[i]).toFixed(1), y = Y(p[i + 1]).toFixed(1);
      if (!d) d = "M" + x + "," + y;
      else if (l.step) d += "H" + x + "V" + y;
      else d += "L" + x + "," + y;
    }
    if (l.step && l.end != null && p.length) d += "H" + X(l.end).toFixed(1);
    if (d) sv("path", {d: d, fill: "none", stroke: l.color, "stroke-width": l.width || 1.8,
                       "stroke-dasharray": l.dash || null, "stroke-linejoin": "round",
                       cls: "line line-" + l.id}, plot);
    if (l.dots) {
      var vis = 0;
      for (var j = 0; j < p.length; j += 2) if (p[j] >= x0 && p[j] <= x1) vis++;
      if (vis <= 80) for (var m = 0; m < p.length; m += 2)
        sv("circle", {cx: X(p[m]), cy: Y(p[m + 1]), r: 2.6, fill: l.color}, plot);
    }
  });
  // budget
  if (o.budget && !this.hidden.budget) {
    sv("line", {x1: ml, x2: ml + pw, y1: Y(o.budget), y2: Y(o.budget), stroke: COL.budget,
                "stroke-width": 1.5, "stroke-dasharray": "7,4", cls: "budget"}, svg);
    sv("text", {x: ml + pw - 6, y: Y(o.budget) - 6, "text-anchor": "end", fill: COL.budget,
                cls: "label", text: "budget " + fmtBytes(o.budget)}, svg);
  }
  // denials and failures; the first denial in view names its site beside its marker
  var named = false;
  (o.markers || []).forEach(function (e) {
    if (e[0] < x0 || e[0] > x1) return;
    var cx = X(e[0]), cy = Y(Math.min(e[4] == null ? 0 : e[4], ytop * 0.98));
    if (e[1] === "denied" && !named && e[5]) {
      named = true;
      var left = cx > ml + pw * 0.6;
      sv("text", {x: cx + (left ? -9 : 9), y: Math.max(cy - 12, mt + 10), "text-anchor": left ? "end" : "start",
                  fill: COL.deny, cls: "label strong deny-site", text: "denied: " + e[5]}, svg);
    }
    var what = (e[1] === "denied" ? "denied by the budget: " : "failed: ") + fmtBytes(e[3]) +
               " at " + fmtTime(e[0], x1, xs / 1000);
    var mk = e[1] === "denied"
      ? sv("path", {d: "M" + cx + " " + (cy - 1) + "l-5 -9h10z", fill: COL.deny, cls: "marker deny"}, svg)
      : sv("path", {d: "M" + (cx - 4.5) + " " + (cy - 4.5) + "l9 9m0 -9l-9 9", stroke: COL.fail,
                    "stroke-width": 2.4, cls: "marker fail"}, svg);
    mk.addEventListener("mousemove", function (ev) {
      showTip(ev, [el("b", {text: what}), e[5], e[6] || ""]);
      ev.stopPropagation();
    });
    mk.addEventListener("mouseleave", hideTip);
  });
  // peaks
  (o.peaks || []).forEach(function (p) {
    if (p.t < x0 || p.t > x1) return;
    var px = X(p.t), py = Y(p.v);
    sv("circle", {cx: px, cy: py, r: 5, fill: "#fff", stroke: p.color, "stroke-width": 2.2, cls: "peak"}, svg);
    var right = px < ml + pw * 0.72;
    if (o.moments && o.moments[o.selected] === p.t) return;
    sv("text", {x: px + (right ? 9 : -9), y: Math.max(py - 8, mt + 10), "text-anchor": right ? "start" : "end",
                fill: p.color, cls: "label strong", text: p.label}, svg);
  });
  // moments: ticks under the plot, the chosen one as a line
  if (o.moments) {
    var mg = sv("g", {cls: "moments"}, svg);
    o.moments.forEach(function (t, i) {
      if (t < x0 || t > x1) return;
      sv("rect", {x: X(t) - 1, y: mt + ph - 7, width: 2, height: 7, cls: "mtick" + (i === o.selected ? " sel" : ""),
                  "data-i": i, "data-t": t}, mg);
    });
    var st = o.moments[o.selected];
    if (st != null && st >= x0 && st <= x1) {
      sv("line", {x1: X(st), x2: X(st), y1: mt - 4, y2: mt + ph, cls: "chosen"}, svg);
      var lx = X(st), right2 = lx < ml + pw * 0.8;
      sv("text", {x: lx + (right2 ? 5 : -5), y: mt - 8, "text-anchor": right2 ? "start" : "end",
                  cls: "label chosen-label", text: o.selectedLabel || ""}, svg);
    }
  }
  sv("rect", {x: ml, y: mt, width: pw, height: ph, fill: "none", cls: "frame"}, svg);
  var guide = sv("line", {x1: 0, x2: 0, y1: mt, y2: mt + ph, cls: "guide", visibility: "hidden"}, svg);
  var brush = sv("rect", {x: 0, y: mt, width: 0, height: ph, cls: "brush", visibility: "hidden"}, svg);
  var over = sv("rect", {x: ml, y: mt, width: pw, height: ph, fill: "transparent", cls: "overlay"});
  svg.insertBefore(over, guide);

  function tAt(ev) {
    var r = svg.getBoundingClientRect();
    return x0 + (ev.clientX - r.left - ml) / pw * xs;
  }
  var down = null;
  over.addEventListener("mousedown", function (ev) { down = ev.clientX; ev.preventDefault(); });
  over.addEventListener("mousemove", function (ev) {
    var r = svg.getBoundingClientRect(), x = ev.clientX - r.left;
    guide.setAttribute("x1", x); guide.setAttribute("x2", x); guide.setAttribute("visibility", "visible");
    if (down != null && Math.abs(ev.clientX - down) > 4) {
      var a = Math.min(down, ev.clientX) - r.left, b = Math.max(down, ev.clientX) - r.left;
      brush.setAttribute("x", a); brush.setAttribute("width", b - a); brush.setAttribute("visibility", "visible");
    }
    var t = tAt(ev), rows = [el("b", {text: fmtTime(t, x1, xs / 1000)})];
    lines.forEach(function (l) {
      var v = valueAt(l.pts, t, l.step);
      if (v != null) rows.push(el("div", {}, [el("span", {cls: "sw", style: "background:" + l.color}),
                                              l.label + ": " + fmtBytes(v)]));
    });
    if (o.moments && o.onpick) rows.push(el("div", {cls: "muted", text: "click: the live set at the nearest moment kept"}));
    showTip(ev, rows);
  });
  over.addEventListener("mouseleave", function () { guide.setAttribute("visibility", "hidden"); hideTip(); });
  over.addEventListener("mouseup", function (ev) {
    brush.setAttribute("visibility", "hidden");
    if (down == null) return;
    var r = svg.getBoundingClientRect(), d0 = down;
    down = null;
    if (Math.abs(ev.clientX - d0) > 4) {
      var ta = x0 + (Math.min(d0, ev.clientX) - r.left - ml) / pw * xs;
      var tb = x0 + (Math.max(d0, ev.clientX) - r.left - ml) / pw * xs;
      self.zoom = [Math.max(ta, o.full[0]), Math.min(tb, o.full[1])];
      self.draw(self.o);
      return;
    }
    if (o.moments && o.onpick) {
      var t = tAt(ev), best = -1, bd = Infinity;
      o.moments.forEach(function (mt2, i) {
        var dd = Math.abs(X(mt2) - X(t));
        if (mt2 >= x0 - xs * 0.02 && mt2 <= x1 + xs * 0.02 && dd < bd) { bd = dd; best = i; }
      });
      if (best >= 0) o.onpick(best);
    }
  });
  over.addEventListener("dblclick", function () { self.zoom = null; self.draw(self.o); });
  clear(this.box).append(svg);
  this.legend(o);
};
function valueAt(p, t, step) {
  if (!p.length || t < p[0]) return null;
  for (var i = 0; i + 2 < p.length; i += 2) {
    if (p[i + 2] > t) {
      if (step) return p[i + 1];
      var f = (t - p[i]) / ((p[i + 2] - p[i]) || 1);
      return p[i + 1] + f * (p[i + 3] - p[i + 1]);
    }
  }
  return p[p.length - 1];
}
Chart.prototype.legend = function (o) {
  var self = this, box = clear(this.legendBox);
  function item(id, color, label, kind, toggle) {
    var sw = kind === "area" ? el("span", {cls: "sw area", style: "background:" + color})
           : kind === "dash" ? el("span", {cls: "sw dash", style: "border-color:" + color})
           : kind === "mark" ? el("span", {cls: "sw mark", style: "color:" + color, text: color === COL.deny ? "\u25bc" : "\u2715"})
           : el("span", {cls: "sw line", style: "background:" + color});
    var it = el("span", {cls: "li" + (toggle ? " toggle" : "") + (self.hidden[id] ? " off" : ""),
                         title: toggle ? "click to show or hide" : null}, [sw, label]);
    if (toggle) it.addEventListener("click", function () { self.hidden[id] = !self.hidden[id]; self.draw(self.o); });
    box.append(it);
  }
  var dom = this.zoom || o.domain;
  o.lines.forEach(function (l) {
    var seen = false;
    for (var i = 0; i < l.pts.length && !seen; i += 2) seen = l.pts[i] >= dom[0] && l.pts[i] <= dom[1];
    item(l.id, l.color, l.label + (seen || l.step ? "" : " (no sample in view)"), l.dash ? "dash" : "line", l.toggle);
  });
  if (o.budget) item("budget", COL.budget, "budget " + fmtBytes(o.budget), "dash", true);
  if (o.areas) o.areas.layers.forEach(function (l) { item("", l.color, l.label, "area", false); });
  var marks = o.markers || [];
  if (marks.some(function (e) { return e[1] === "denied"; })) item("", COL.deny, "denied by the budget", "mark");
  if (marks.some(function (e) { return e[1] === "failed"; })) item("", COL.fail, "failed allocation", "mark");
  if (o.note) box.append(el("div", {cls: "legend-note", text: o.note}));
};

// ---- the flame graph (icicle: callers on top, the allocating frame at the bottom) ---------

// A flame graph of stacks (report) or of two runs' stacks (diff). flip: false draws an icicle
// (the root on top, the allocating frames at the bottom), true a flame graph (the root at the
// bottom); layers: each site's allocator layers (the frames between it and the driver) below it.
function Flame(box, status, diff) {
  this.box = box; this.status = status; this.diff = diff; this.zoom = []; this.search = "";
  this.flip = false; this.layers = false;
}
// rows: [[stack id, process, device, bytes, count, side]]; returns the tree
Flame.prototype.build = function (rows, byProcess, procNames) {
  var root = {key: "root", name: "all", mod: "", a: 0, b: 0, ca: 0, cb: 0, kids: new Map(), parent: null};
  var withLayers = this.layers;
  rows.forEach(function (r) {
    var st = STACKS[r[0]], path = st[1], site = path.length - (st[2] || 0), node = root, side = r[5] || 0;
    var end = withLayers ? path.length : site;
    add(node, r, side);
    if (byProcess) node = child(node, "p" + r[1], procNames[r[1]], "process", r, side, false);
    for (var i = 0; i < end; i++) {
      var layer = i >= site;   // below the site: one of the allocator layers it went through
      node = child(node, (layer ? "l" : "f") + path[i], FRAMES[path[i]][0], FRAMES[path[i]][1], r, side, layer);
    }
  });
  function add(n, r, side) { if (side) { n.b += r[3]; n.cb += r[4]; } else { n.a += r[3]; n.ca += r[4]; } }
  function child(n, key, name, mod, r, side, layer) {
    var c = n.kids.get(key);
    if (!c) { c = {key: key, name: name, mod: mod, layer: layer, a: 0, b: 0, ca: 0, cb: 0, kids: new Map(), parent: n}; n.kids.set(key, c); }
    add(c, r, side);
    return c;
  }
  var diff = this.diff;
  (function weigh(n) {       // a diff's width: the larger of A and B, and room for the children
    var s = 0;
    n.kids.forEach(function (c) { s += weigh(c); });
    n.w = Math.max(diff ? Math.max(n.a, n.b) : n.a, s);
    return n.w;
  })(root);
  this.root = root;
  return root;
};
Flame.prototype.matches = function (n) {
  if (!this.re) return false;
  return this.re.test(n.name) || (n.mod && this.re.test(n.mod));
};
Flame.prototype.setSearch = function (text) {
  this.search = text || "";
  this.re = null;
  if (this.search) {
    var m = this.search.match(/^\/(.+)\/$/);
    try { this.re = m ? new RegExp(m[1], "i") : new RegExp(this.search.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i"); }
    catch (e) { this.re = null; }
  }
};
Flame.prototype.draw = function () {
  if (!this.root) return;
  var self = this, root = this.root, box = clear(this.box);
  var W = Math.max(box.clientWidth, 480), RH = 22;
  // the zoomed node: follow the path of keys
  var z = root, path = [root];
  for (var i = 0; i < this.zoom.length; i++) {
    var c = z.kids.get(this.zoom[i]);
    if (!c) break;
    z = c; path.push(c);
  }
  var total = this.diff ? root.w : root.a;
  var maxDepth = 0, nodes = [];
  path.forEach(function (n, d) { nodes.push([n, d, 0, W, n !== z]); });
  (function lay(n, d, x, w) {
    if (d > maxDepth) maxDepth = d;
    if (n !== z) nodes.push([n, d, x, w, false]);
    var kids = Array.from(n.kids.values()).sort(function (p, q) { return q.w - p.w || (p.name < q.name ? -1 : 1); });
    var cx = x;
    kids.forEach(function (k) {
      var kw = n.w ? w * k.w / n.w : 0;
      if (kw >= 0.5) lay(k, d + 1, cx, kw);
      cx += kw;
    });
  })(z, path.length - 1, 0, W);
  box.style.height = ((maxDepth + 1) * RH + 2) + "px";
  box.classList.toggle("flipped", this.flip);
  var matched = 0, nmatch = 0;
  function coveredByMatch(n) { for (var p = n.parent; p; p = p.parent) if (self.matches(p)) return true; return false; }
  nodes.forEach(function (it) {
    var n = it[0], d = it[1], x = it[2], w = it[3], anc = it[4];
    var isMatch = self.matches(n);
    if (isMatch && !anc) { nmatch++; if (!coveredByMatch(n)) matched += self.diff ? n.b : n.a; }
    var label = n === root ? (self.diff ? "all: " + fmtBytes(root.a) + " \u2192 " + fmtBytes(root.b)
                                        : "all: " + fmtBytes(root.a) + " live") : n.name;
    var div = el("div", {cls: "fr" + (anc ? " anc" : "") + (isMatch ? " match" : "") + (n === root ? " root" : "") +
                         (n.mod === "process" ? " proc" : "") + (n.layer ? " layer" : ""),
                         "data-name": n.name, "data-depth": d, text: w > 28 ? label : ""});
    div.style.left = x + "px"; div.style.top = (self.flip ? maxDepth - d : d) * RH + "px";
    div.style.width = Math.max(w - 1, 0.5) + "px";
    div.style.background = self.color(n, isMatch);
    if (self.dark) div.style.color = "#fff";
    div.addEventListener("click", function () {
      var keys = [];
      for (var p = n; p && p !== root; p = p.parent) keys.unshift(p.key);
      self.zoom = keys;
      self.draw();
      if (self.onzoom) self.onzoom();
    });
    div.addEventListener("mousemove", function (ev) { showTip(ev, self.tipFor(n, total)); });
    div.addEventListener("mouseleave", hideTip);
    box.append(div);
  });
  if (!root.kids.size) box.append(el("div", {cls: "empty", text: "nothing live at this moment"}));
  var msg = [];
  if (this.zoom.length) msg.push("zoomed in on " + z.name + " (click \u201call\u201d or the frames above to zoom out)");
  if (this.search) {
    if (!this.re) msg.push("the search is not a valid pattern");
    else msg.push(nmatch + " frame" + (nmatch === 1 ? "" : "s") + " match \u201c" + this.search + "\u201d" +
                  (nmatch && !this.diff ? ": " + fmtBytes(matched) + " (" + pct(root.a ? matched / root.a : 0) + " of the moment)" : ""));
  }
  this.status.textContent = msg.join("; ");
  this.nmatch = nmatch;
};
Flame.prototype.color = function (n, isMatch) {
  this.dark = false;
  if (isMatch) return "#f5d90a";
  if (n.key === "root") return "#d9dde3";
  if (n.mod === "process") return "#cfd6e4";
  if (n.layer && !this.diff) return "hsl(214," + (28 + hash(n.name) % 12) + "%,80%)";
  if (this.diff) {
    var d = n.b - n.a, m = Math.max(n.a, n.b) || 1, f = Math.min(1, Math.abs(d) / m);
    if (d === 0) return "#e4e1dc";
    f = 0.18 + 0.82 * Math.sqrt(f);
    this.dark = f > 0.62;
    return d > 0 ? mix([246, 232, 226], [215, 48, 39], f) : mix([227, 236, 246], [33, 102, 172], f);
  }
  var h = hash(n.mod || ""), v = hash(n.name);
  var hue = [16, 30, 6, 40, 352, 24][h % 6] + (v % 9) - 4;
  var light = 67 + (v >> 4) % 12;
  return "hsl(" + hue + ",74%," + light + "%)";
};
function mix(a, b, f) {
  return "rgb(" + a.map(function (x, i) { return Math.round(x + (b[i] - x) * f); }).join(",") + ")";
}
Flame.prototype.tipFor = function (n, total) {
  var out = [el("b", {text: n.name})];
  if (n.mod && n.mod !== "process") out.push(el("div", {cls: "muted", text: n.mod}));
  if (n.layer) out.push(el("div", {cls: "muted", text: "an allocator layer the site's memory went through"}));
  if (this.diff) {
    var d = n.b - n.a;
    out.push("A: " + fmtBytes(n.a) + " in " + fmtCount(n.ca) + " allocation" + (n.ca === 1 ? "" : "s"));
    out.push("B: " + fmtBytes(n.b) + " in " + fmtCount(n.cb) + " allocation" + (n.cb === 1 ? "" : "s"));
    out.push(el("div", {cls: d > 0 ? "grown" : d < 0 ? "shrunk" : "", text: "change: " + signedBytes(d) +
      (n.a ? " (" + (d >= 0 ? "+" : "") + (100 * d / n.a).toFixed(1) + "%)" : n.b ? " (new)" : "")}));
  } else {
    out.push(fmtBytes(n.a) + " in " + fmtCount(n.ca) + " allocation" + (n.ca === 1 ? "" : "s") +
             " \u2014 " + pct(total ? n.a / total : 0) + " of the moment");
  }
  out.push(el("div", {cls: "muted", text: "click to zoom"}));
  return out;
};

// ---- sortable tables ----------------------------------------------------------------------

function sortableTable(box, cols, rows, opts) {
  // cols: [{label, get (row) -> sortable, show (row) -> text|Node, num, cls}]; rows: any[]
  var state = {col: opts.sortCol, dir: opts.sortDir || -1, limit: opts.limit || 50};
  function render() {
    var sorted = rows.slice();
    var c = cols[state.col];
    sorted.sort(function (p, q) {
      var a = c.get(p), b = c.get(q);
      if (a === b) return 0;
      return (a < b ? -1 : 1) * state.dir;
    });
    var table = el("table", {cls: "grid sites"});
    var head = el("tr");
    cols.forEach(function (col, i) {
      head.append(el("th", {cls: (col.num ? "n " : "") + "sortable" + (i === state.col ? " sorted" : ""),
        title: "sort by " + col.label, onclick: function () {
          if (state.col === i) state.dir = -state.dir; else { state.col = i; state.dir = col.num ? -1 : 1; }
          render();
        }}, [col.label, el("span", {cls: "arrow", text: i === state.col ? (state.dir < 0 ? " \u25be" : " \u25b4") : ""})]));
    });
    table.append(el("thead", {}, [head]));
    var tb = el("tbody");
    sorted.slice(0, state.limit).forEach(function (r) {
      var tr = el("tr", {cls: "row" + (opts.rowClass ? " " + opts.rowClass(r) : "")});
      cols.forEach(function (col) {
        var v = col.show ? col.show(r) : col.get(r);
        tr.append(el("td", {cls: (col.num ? "n" : "") + (col.cls ? " " + col.cls : "")}, [v]));
      });
      if (opts.detail) {
        tr.title = "click for the call stack";
        tr.addEventListener("click", function () {
          var next = tr.nextSibling;
          if (next && next.classList.contains("detail")) { next.remove(); tr.classList.remove("open"); return; }
          tr.classList.add("open");
          tr.after(el("tr", {cls: "detail"}, [el("td", {colspan: cols.length}, [opts.detail(r)])]));
        });
      }
      tb.append(tr);
    });
    table.append(tb);
    clear(box).append(table);
    if (sorted.length > state.limit) {
      box.append(el("button", {type: "button", cls: "more", text: "show all " + sorted.length + " rows",
        onclick: function () { state.limit = Infinity; render(); }}));
    }
  }
  render();
}
function stackDetail(site, onfind) {
  var s = SITES[site], box = el("div", {cls: "stack"});
  var fr = s[5];
  if (!fr.length) box.append(el("div", {cls: "muted", text: "no call stack recorded"}));
  fr.forEach(function (f, i) {
    box.append(el("div", {cls: "sf"}, [el("span", {cls: "at", text: i ? "from" : "at"}), f]));
  });
  box.append(el("div", {cls: "muted key", text: "site key: " + s[1]}));
  if (onfind) box.append(el("button", {type: "button", cls: "find", text: "highlight in the flame graph",
    onclick: function (ev) { ev.stopPropagation(); onfind(s[0]); }}));
  return box;
}
function siteFn(label) { return label.replace(/ \(.*$/, ""); }

// the flame graph's own controls, on both pages: its orientation and the allocator layers
function flameControls(box, flame, redraw) {
  box.append(segmented("view", [["icicle", "icicle"], ["flame", "flame"]], "icicle", function (v) {
    flame.flip = v === "flame"; redraw(); }));
  var cb = el("input", {type: "checkbox", id: "layers"});
  cb.addEventListener("change", function () { flame.layers = cb.checked; flame.zoom = []; redraw(); });
  box.append(el("label", {cls: "check", title: "the frames between each site and the driver call"},
                [cb, " allocator layers"]));
}
function flameHow(flame) {
  return (flame.flip ? "The callers at the bottom, the allocating frames on top"
                     : "The callers on top, the allocating frames at the bottom") +
    (flame.layers ? ", each site's allocator layers beyond it" : "") +
    "; a frame's width is the device memory live under it. Frames are matched by function, file and module.";
}

// ---- the report page ----------------------------------------------------------------------

function reportPage() {
  var R = D.report, run = D.run, moments = run.moments;
  var S = {moment: D.initial || 0, view: "all", stackBy: "site", byProcess: false};
  if (R.device != null && run.views["" + R.device]) S.view = "" + R.device;     // report --device N
  var procNames = run.procs.map(function (p) { return "pid " + p[0] + " (" + p[1] + ")"; });
  var chart = new Chart(document.getElementById("timeline"), document.getElementById("legend"));
  var flame = new Flame(document.getElementById("flame"), document.getElementById("flame-status"), false);
  var peakIdx = moments.findIndex(function (m) { return m.kind === "peak"; });
  var obsAll = run.views.all.observed;
  if (obsAll.tree_device || obsAll.device_used) chart.hidden.avail = true;   // NVML says more; host RAM on a click

  var span = run.span, full = [0, Math.max(span[2], span[1], 1e-3)];
  var act = span[1] - span[0];
  var fit = act < 0.5 * (full[1] - full[0])
    ? [Math.max(0, span[0] - (act > 0 ? act * 0.04 : 1e-4)), span[1] + (act > 0 ? act * 0.04 : 1e-4)] : full;

  function rowsOf(mo) {
    var out = [], r = mo.rows, dev = S.view === "all" ? null : +S.view;
    for (var i = 0; i < r.length; i += 5) if (dev == null || r[i + 2] === dev) out.push([r[i], r[i + 1], r[i + 2], r[i + 3], r[i + 4], 0]);
    return out;
  }
  function momentTotal(mo) {
    if (S.view === "all") return mo.bytes;
    var s = 0; rowsOf(mo).forEach(function (r) { s += r[3]; }); return s;
  }
  function describe(mo) {
    var k = mo.kind === "peak" ? "the peak" + (R.devices.length > 1 ? ", all devices together" : "") : mo.kind === "end" ? "the end" : mo.kind === "failed" ? "a failed allocation"
          : mo.kind === "denied" ? "a budget denial" : mo.kind === "device peak" ? "device " + mo.device + "'s peak" : "";
    return fmtTime(mo.t, full[1]) + (k ? " (" + k + ")" : "");
  }
  function areas() {
    if (S.stackBy === "none") return null;
    var byKey = new Map(), times = [];
    moments.forEach(function (mo, i) {
      times.push(mo.t);
      rowsOf(mo).forEach(function (r) {
        var k = S.stackBy === "process" ? r[1] : S.stackBy === "rank" ? run.ranks[r[1]] : STACKS[r[0]][0];
        var v = byKey.get(k);
        if (!v) { v = new Array(moments.length).fill(0); byKey.set(k, v); }
        v[i] += r[3];
      });
    });
    var keys = Array.from(byKey.keys()).sort(function (p, q) {
      return Math.max.apply(null, byKey.get(q)) - Math.max.apply(null, byKey.get(p));
    });
    var top = keys.slice(0, 8), rest = keys.slice(8), layers = [];
    top.forEach(function (k, i) {
      layers.push({label: S.stackBy === "process" ? procNames[k] : S.stackBy === "rank" ? k : SITES[k][0], color: PALETTE[i % PALETTE.length], values: byKey.get(k)});
    });
    if (rest.length) {
      var other = new Array(moments.length).fill(0);
      rest.forEach(function (k) { byKey.get(k).forEach(function (v, i) { other[i] += v; }); });
      layers.push({label: rest.length + " more " + (S.stackBy === "process" ? "processes" : S.stackBy === "rank" ? "ranks" : "sites"), color: OTHER, values: other});
    }
    var totals = moments.map(function (mo, i) { var s = 0; layers.forEach(function (l) { s += l.values[i]; }); return s; });
    return {times: times, layers: layers, totals: totals, end: span[1]};
  }
  function scope() {    // whose peak the marker is: the same words as the cards at the top
    return S.view !== "all" ? "device " + S.view + ": " : R.devices.length > 1 ? "all devices together: " : "";
  }
  function drawChart() {
    var v = run.views[S.view], o = v.observed, lines = [];
    lines.push({id: "traced", label: "traced live (every hooked allocation)", color: COL.traced, pts: v.line, step: true, end: span[1], width: 2});
    if (o.tree_device) lines.push({id: "tree", label: "NVML: the process tree", color: COL.tree, pts: o.tree_device, dots: true, toggle: true});
    if (o.device_used) lines.push({id: "used", label: "NVML: device used (everyone)", color: COL.used, pts: o.device_used, dash: "5,4", dots: true, toggle: true, width: 1.4});
    if (o.mem_available_drop) lines.push({id: "avail", label: "MemAvailable drop since the start (host)", color: COL.avail, pts: o.mem_available_drop, dots: true, toggle: true, width: 1.6});
    if (o.tree_rss) lines.push({id: "rss", label: "process tree RSS", color: COL.rss, pts: o.tree_rss, dash: "3,3", dots: true, toggle: true, width: 1.4});
    var mo = moments[S.moment];
    var ar = areas();
    chart.draw({
      lines: lines, areas: ar, budget: v.budget,
      markers: run.events.filter(function (e) { return S.view === "all" || e[2] === +S.view; }),
      peaks: v.peak ? [{t: v.peak[0], v: v.peak[1], color: COL.traced, label: scope() + "peak " + fmtBytes(v.peak[1]) + " at " + fmtTime(v.peak[0], full[1])}] : [],
      moments: moments.map(function (m) { return m.t; }), selected: S.moment,
      selectedLabel: mo ? describe(mo) + ": " + fmtBytes(momentTotal(mo)) : "",
      onpick: function (i) { pick(i); },
      domain: fit, full: full,
      note: ar && moments.length ? "Coloured areas: the live set by " + S.stackBy + " at each of the " + moments.length +
            " moments kept (ticks under the chart), held until the next; the blue line: the traced total, exact." : null
    });
  }
  function drawFlame() {
    var mo = moments[S.moment];
    if (!mo) {
      document.getElementById("flame-title").textContent = "No device memory was allocated through the hooked driver API";
      clear(document.getElementById("flame")).append(el("div", {cls: "empty", text: "nothing to show: the trace holds no device allocation"}));
      return;
    }
    var rows = rowsOf(mo);
    flame.build(rows, S.byProcess, procNames);
    flame.draw();
    var tot = 0, cnt = 0; rows.forEach(function (r) { tot += r[3]; cnt += r[4]; });
    var title = document.getElementById("flame-title");
    title.textContent = "Live at " + describe(mo) + ": " + fmtBytes(tot) + " in " + fmtCount(cnt) + " allocation" + (cnt === 1 ? "" : "s");
    title.setAttribute("data-bytes", tot);
    title.setAttribute("data-moment", S.moment);
    document.getElementById("flame-sub").textContent = flameHow(flame) +
      (S.view !== "all" ? " Device " + S.view + " only." : "");
  }
  function drawSites() {
    var mo = moments[S.moment], peak = peakIdx >= 0 ? moments[peakIdx] : null;
    var at = new Map(), atPeak = new Map(), tot = 0;
    if (mo) rowsOf(mo).forEach(function (r) {
      var s = STACKS[r[0]][0], x = at.get(s) || [0, 0]; x[0] += r[3]; x[1] += r[4]; at.set(s, x); tot += r[3];
    });
    if (peak) rowsOf(peak).forEach(function (r) { var s = STACKS[r[0]][0]; atPeak.set(s, (atPeak.get(s) || 0) + r[3]); });
    var rows = SITES.map(function (s, i) { return i; }).filter(function (i) { return at.has(i) || atPeak.has(i) || SITES[i][3][0] > 0; });
    var rank = rows.slice().sort(function (p, q) { return ((at.get(q) || [0])[0] - (at.get(p) || [0])[0]) || ((atPeak.get(q) || 0) - (atPeak.get(p) || 0)); });
    var rk = new Map(); rank.forEach(function (s, i) { rk.set(s, i + 1); });
    document.getElementById("sites-title").textContent = "Call sites: live at " + (mo ? describe(mo) : "-") + ", at the peak and over the run";
    var cols = [
      {label: "#", num: true, get: function (s) { return -rk.get(s); }, show: function (s) { return "" + rk.get(s); }},
      {label: "call site", get: function (s) { return SITES[s][0].toLowerCase(); }, show: function (s) {
        return el("span", {cls: "site-label", title: SITES[s][1]}, [SITES[s][0]]); }, cls: "label"},
      {label: "live now", num: true, get: function (s) { return (at.get(s) || [0])[0]; }, show: function (s) { return fmtBytes((at.get(s) || [0])[0]); }},
      {label: "share", num: true, get: function (s) { return (at.get(s) || [0])[0]; }, show: function (s) {
        var v = tot ? (at.get(s) || [0])[0] / tot : 0;
        return el("span", {cls: "share"}, [el("span", {cls: "bar", style: "width:" + (v * 100).toFixed(1) + "%"}), pct(v)]); }},
      {label: "allocations now", num: true, get: function (s) { return (at.get(s) || [0, 0])[1]; }, show: function (s) { return fmtCount((at.get(s) || [0, 0])[1]); }},
      {label: "at the peak", num: true, get: function (s) { return atPeak.get(s) || 0; }, show: function (s) { return fmtBytes(atPeak.get(s) || 0); }},
      {label: "allocated over the run", num: true, get: function (s) { return SITES[s][4][0]; }, show: function (s) {
        return fmtBytes(SITES[s][4][0]) + " in " + fmtCount(SITES[s][3][0]); }},
      {label: "API", get: function (s) { return SITES[s][2].join(", "); }, cls: "api"}
    ];
    sortableTable(document.getElementById("sites"), cols, rows, {sortCol: 2, sortDir: -1,
      rowClass: function (s) { return at.has(s) ? "" : "dim"; },
      detail: function (s) { return stackDetail(s, function (label) { setSearch(siteFn(label)); }); }});
  }
  var searchBox;
  function setSearch(text) {
    searchBox.value = text;
    flame.setSearch(text);
    flame.draw();
    document.getElementById("flame-card").scrollIntoView({behavior: "smooth", block: "start"});
  }
  function pick(i) {
    if (i < 0 || i >= moments.length) return;
    S.moment = i;
    drawChart(); drawFlame(); drawSites();
  }
  function drawAll() { drawChart(); drawFlame(); drawSites(); }

  // controls
  var tc = document.getElementById("timeline-controls");
  tc.append(segmented("stack by", [["site", "site"], ["process", "process"]].concat(run.ranks ? [["rank", "rank"]] : []).concat([["none", "none"]]), S.stackBy,
                      function (v) { S.stackBy = v; drawChart(); }));
  if (run.devices.length > 1) {
    tc.append(segmented("device", [["all", "all"]].concat(run.devices.map(function (d) { return ["" + d, "" + d]; })), S.view,
                        function (v) { S.view = v; chart.zoom = null; drawAll(); }));
  }
  tc.append(segmented("show", [["fit", "traced activity"], ["full", "whole run"]], "fit", function (v) {
    chart.zoom = v === "full" ? full : null; drawChart(); }));
  var fc = document.getElementById("flame-controls");
  searchBox = el("input", {type: "search", id: "search", placeholder: "search frames (text or /regex/)",
                           "aria-label": "search frames"});
  searchBox.addEventListener("input", function () { flame.setSearch(searchBox.value); flame.draw(); });
  fc.append(searchBox);
  var momentSeg = segmented("moment", [["peak", "peak"], ["end", "end"]], null, function (v) {
    pick(moments.findIndex(function (m) { return m.kind === v; }));
    momentSeg.querySelectorAll("button").forEach(function (b) { b.classList.remove("on"); });   // a jump, not a mode
  });
  fc.append(momentSeg);
  flameControls(fc, flame, drawFlame);
  if (run.procs.length > 1) {
    var cb = el("input", {type: "checkbox", id: "byproc"});
    cb.addEventListener("change", function () { S.byProcess = cb.checked; flame.zoom = []; drawFlame(); });
    fc.append(el("label", {cls: "check"}, [cb, " split by process"]));
  }
  document.addEventListener("keydown", function (ev) {
    if (ev.target && (ev.target.tagName === "INPUT" || ev.target.tagName === "TEXTAREA")) return;
    if (ev.key === "ArrowLeft") { pick(S.moment - 1); ev.preventDefault(); }
    if (ev.key === "ArrowRight") { pick(S.moment + 1); ev.preventDefault(); }
  });
  var rt;
  window.addEventListener("resize", function () { clearTimeout(rt); rt = setTimeout(function () { drawChart(); flame.draw(); }, 120); });
  drawAll();
  window.cudatrace = {data: D, pick: pick, state: S};
}

// ---- the diff page ------------------------------------------------------------------------

function diffPage() {
  var d = D.diff, runs = D.runs;
  var S = {which: "peak", align: "first"};
  var chart = new Chart(document.getElementById("timeline"), document.getElementById("legend"));
  var flame = new Flame(document.getElementById("flame"), document.getElementById("flame-status"), true);
  function shifted(pts, by) {
    var out = pts.slice();
    for (var i = 0; i < out.length; i += 2) out[i] -= by;
    return out;
  }
  function drawChart() {
    // "first": each run from its first device allocation (its first event when it made none)
    var sh = runs.map(function (r) {
      return S.align === "first" ? (r.first_alloc != null ? r.first_alloc : r.span[0]) : 0; });
    var from = runs.map(function (r) {  // the traced activity: from the first allocation
      return S.align === "first" && r.first_alloc != null ? r.first_alloc : r.span[0]; });
    var span = [Math.min(from[0] - sh[0], from[1] - sh[1]),
                Math.max(runs[0].span[1] - sh[0], runs[1].span[1] - sh[1]),
                Math.max(runs[0].span[2] - sh[0], runs[1].span[2] - sh[1])];
    var full = [Math.min(0, span[0]), Math.max(span[2], span[1], 1e-3)], act = span[1] - span[0];
    var fit = act < 0.5 * (full[1] - full[0])
      ? [span[0] - (act > 0 ? act * 0.04 : 1e-4), span[1] + (act > 0 ? act * 0.04 : 1e-4)] : full;
    var va = runs[0].views.all, vb = runs[1].views.all, peaks = [];
    if (va.peak) peaks.push({t: va.peak[0] - sh[0], v: va.peak[1], color: COL.a, label: "A: peak " + fmtBytes(va.peak[1])});
    if (vb.peak) peaks.push({t: vb.peak[0] - sh[1], v: vb.peak[1], color: COL.b, label: "B: peak " + fmtBytes(vb.peak[1])});
    var marks = runs[0].events.map(function (e) { return [e[0] - sh[0]].concat(e.slice(1)); })
      .concat(runs[1].events.map(function (e) { return [e[0] - sh[1]].concat(e.slice(1)); }));
    chart.full = full;
    chart.draw({lines: [
        {id: "a", label: "A: traced live", color: COL.a, pts: shifted(va.line, sh[0]), step: true, end: runs[0].span[1] - sh[0], width: 2},
        {id: "b", label: "B: traced live", color: COL.b, pts: shifted(vb.line, sh[1]), step: true, end: runs[1].span[1] - sh[1], width: 2}],
      budget: null, markers: marks, peaks: peaks, domain: fit, full: full,
      xlabel: S.align === "first" ? "time since each run's first allocation" : "time since each run started"});
  }
  function rowsAt(side) {
    var mo = runs[side].moments.find(function (m) { return m.kind === S.which; }), out = [];
    if (!mo) return out;
    for (var i = 0; i < mo.rows.length; i += 5) out.push([mo.rows[i], mo.rows[i + 1], mo.rows[i + 2], mo.rows[i + 3], mo.rows[i + 4], side]);
    return out;
  }
  function drawFlame() {
    flame.build(rowsAt(0).concat(rowsAt(1)), false, []);
    flame.draw();
    var r = flame.root, dl = r.b - r.a;
    var title = document.getElementById("flame-title");
    title.textContent = "What changed " + (S.which === "peak" ? "at each run's peak" : "at exit") + ": " +
      fmtBytes(r.a) + " \u2192 " + fmtBytes(r.b) + " (" + signedBytes(dl) + ")";
    title.setAttribute("data-a", r.a); title.setAttribute("data-b", r.b);
    document.getElementById("flame-sub").replaceChildren(
      "Width: the larger of A and B; ", el("span", {cls: "grown", text: "red: grown in B"}), ", ",
      el("span", {cls: "shrunk", text: "blue: shrunk"}), " (the deeper the colour, the larger the change); grey: the same. " +
      flameHow(flame));
  }
  function drawSites() {
    var rows = d.sites;
    function st(s) { return el("span", {cls: "badge " + s.status, text: s.status}); }
    var cols = [
      {label: "status", get: function (s) { return s.status; }, show: st},
      {label: "call site", get: function (s) { return s.label.toLowerCase(); }, show: function (s) {
        return el("span", {cls: "site-label", title: s.key}, [s.label]); }, cls: "label"},
      {label: "peak A", num: true, get: function (s) { return s.peak.a_bytes; }, show: function (s) { return fmtBytes(s.peak.a_bytes); }},
      {label: "peak B", num: true, get: function (s) { return s.peak.b_bytes; }, show: function (s) { return fmtBytes(s.peak.b_bytes); }},
      {label: "change", num: true, get: function (s) { return s.peak.delta_bytes; }, show: function (s) {
        return el("span", {cls: s.peak.delta_bytes > 0 ? "grown" : s.peak.delta_bytes < 0 ? "shrunk" : "", text: signedBytes(s.peak.delta_bytes)}); }},
      {label: "count", num: true, get: function (s) { return s.peak.delta_count; }, show: function (s) {
        return s.peak.a_count + " \u2192 " + s.peak.b_count; }},
      {label: "at exit A", num: true, get: function (s) { return s.end.a_bytes; }, show: function (s) { return fmtBytes(s.end.a_bytes); }},
      {label: "at exit B", num: true, get: function (s) { return s.end.b_bytes; }, show: function (s) { return fmtBytes(s.end.b_bytes); }},
      {label: "allocations over the run", num: true, get: function (s) { return s.run.delta_count; }, show: function (s) {
        return s.run.a_count + " \u2192 " + s.run.b_count; }}
    ];
    var absd = function (s) { return Math.max(Math.abs(s.peak.delta_bytes), Math.abs(s.end.delta_bytes)); };
    cols.push({label: "largest change", num: true, get: absd, show: function (s) { return fmtBytes(absd(s)); }});
    sortableTable(document.getElementById("sites"), cols, rows, {sortCol: cols.length - 1, sortDir: -1,
      rowClass: function (s) { return s.status === "same" ? "dim" : ""; },
      detail: function (s) {
        var box = el("div", {cls: "stack"});
        s.frames.forEach(function (f, i) {
          box.append(el("div", {cls: "sf"}, [el("span", {cls: "at", text: i ? "from" : "at"}),
            (f.function || f.module + "+0x" + f.offset.toString(16)) + (f.file ? " (" + f.file.split("/").pop() + ":" + (f.line || "?") + ")" : "")]));
        });
        box.append(el("div", {cls: "muted key", text: "site key: " + s.key}));
        box.append(el("button", {type: "button", cls: "find", text: "highlight in the flame graph",
          onclick: function (ev) { ev.stopPropagation(); setSearch(siteFn(s.label)); }}));
        return box;
      }});
    if (d.more_sites) document.getElementById("sites").append(el("p", {cls: "muted", text: d.more_sites + " more sites not listed"}));
  }
  var searchBox = el("input", {type: "search", id: "search", placeholder: "search frames (text or /regex/)", "aria-label": "search frames"});
  function setSearch(text) { searchBox.value = text; flame.setSearch(text); flame.draw(); }
  searchBox.addEventListener("input", function () { flame.setSearch(searchBox.value); flame.draw(); });
  var fc = document.getElementById("flame-controls");
  fc.append(searchBox);
  fc.append(segmented("compare", [["peak", "at each peak"], ["end", "at exit"]], "peak", function (v) {
    S.which = v; flame.zoom = []; drawFlame(); }));
  flameControls(fc, flame, drawFlame);
  var tcs = document.getElementById("timeline-controls");
  tcs.append(segmented("align", [["first", "first allocation"], ["start", "run start"]], "first",
    function (v) { S.align = v; chart.zoom = null; drawChart(); }));
  tcs.append(segmented("show", [["fit", "traced activity"], ["full", "whole runs"]], "fit",
    function (v) { chart.zoom = v === "full" ? chart.full : null; drawChart(); }));
  var rt;
  window.addEventListener("resize", function () { clearTimeout(rt); rt = setTimeout(function () { drawChart(); flame.draw(); }, 120); });
  drawChart(); drawFlame(); drawSites();
  window.cudatrace = {data: D, state: S};
}

try {
  if (D.kind === "diff") diffPage(); else reportPage();
  document.body.setAttribute("data-ready", "1");
} catch (e) {
  document.body.insertBefore(el("div", {cls: "error", text: "This page could not draw its views: " + e}), document.body.firstChild);
  throw e;
}
})();
