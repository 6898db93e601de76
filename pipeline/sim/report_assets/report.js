/* authpipe report: draws inline SVG charts from the JSON in #report-data. No network,
   no libraries. On success <body data-charts-rendered="N">; any error is written into
   #errors as an element with data-js-error, so a headless browser can check both. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = { attacker: "#c0392b", legit: "#2e86c1", owner: "#27ae60", unknown: "#7f8c8d",
                 attempts: "#2e86c1", failures: "#e67e22", refused: "#8e44ad", block: "#c0392b",
                 observe: "#95a5a6", alert: "#f39c12" };
  var errorBox = document.getElementById("errors");

  function reportError(text) {
    var line = document.createElement("div");
    line.setAttribute("data-js-error", "1");
    line.textContent = "report error: " + text;
    errorBox.appendChild(line);
    document.body.setAttribute("data-js-errors", String(errorBox.children.length));
  }
  window.onerror = function (message, source, lineno) {
    reportError(message + " (line " + lineno + ")");
    return false;
  };
  window.addEventListener("unhandledrejection", function (event) {
    reportError("unhandled rejection: " + event.reason);
  });

  function el(tag, attrs, parent) {
    var node = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function label(parent, x, y, content, attrs) {
    var node = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    node.textContent = content;
    return node;
  }
  function tip(node, content) { el("title", {}, node).textContent = content; return node; }
  function html(tag, attrs, parent, content) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (content !== undefined) { node.textContent = content; }
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function clock(ms) {
    var d = new Date(ms);
    return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
  }
  function stamp(ms) { return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z"); }
  function number(n) { return Number(n).toLocaleString("en-US"); }
  function compact(n) {
    if (n >= 1e6) { return (n / 1e6).toFixed(1) + "M"; }
    if (n >= 1e4) { return Math.round(n / 1e3) + "k"; }
    return String(n);
  }
  function niceMax(v) {
    if (v <= 0) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * p >= v) { return steps[i] * p; } }
    return 10 * p;
  }
  function svgRoot(container, width, height, name) {
    var svg = el("svg", { viewBox: "0 0 " + width + " " + height, role: "img", "data-chart": name });
    container.appendChild(svg);
    return svg;
  }
  function legend(container, items) {
    var box = html("div", { "class": "legend" }, container);
    items.forEach(function (item) {
      html("span", { style: "--swatch:" + item[1] }, box, item[0]);
    });
  }
  // Tick steps, in ms: ticks fall on round UTC times (every 5 min at :00, :05, ...).
  var TICK_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
                    21600, 43200, 86400].map(function (s) { return s * 1000; });
  function tickStep(span, most) {
    for (var i = 0; i < TICK_STEPS.length; i++) { if (span / TICK_STEPS[i] <= most) { return TICK_STEPS[i]; } }
    return TICK_STEPS[TICK_STEPS.length - 1];
  }
  function tickLabel(ms, step) {
    var d = new Date(ms);
    var hm = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    return step < 60000 ? hm + ":" + pad(d.getUTCSeconds()) : hm;
  }
  function timeTicks(svg, x, t0, t1, y, most) {
    var step = tickStep(t1 - t0, most || 8);
    var ticks = 0;
    for (var t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      el("line", { x1: x(t), x2: x(t), y1: y, y2: y + 4, stroke: "#9aa5b1", "data-tick": t }, svg);
      label(svg, x(t), y + 16, tickLabel(t, step), { "text-anchor": "middle" });
      ticks++;
    }
    label(svg, x(t1), y + 28, "UTC", { "text-anchor": "end" });
    return ticks;
  }

  function trafficChart(container, series, name) {
    var W = 1100, H = 310, L = 56, R = 16, T = 12, B = 40;
    var n = series.attempts.length;
    var t0 = series.start_ms, t1 = series.start_ms + n * series.bucket_ms;
    var names = [["attempts", "attempts"], ["failures", "failures"]];
    if (series.attacker) { names.push(["attacker", "attacker attempts"]); }
    if (series.refused) { names.push(["refused", "would be refused"]); }
    legend(container, names.map(function (p) { return [p[1] + " per " + series.bucket_label, COLORS[p[0]]]; }));
    var svg = svgRoot(container, W, H, name || "traffic");
    var top = niceMax(Math.max.apply(null, series.attempts.concat([1])));
    var x = function (t) { return L + (W - L - R) * (t - t0) / Math.max(t1 - t0, 1); };
    var y = function (v) { return T + (H - T - B) * (1 - v / top); };
    for (var g = 0; g <= 4; g++) {
      var v = top * g / 4;
      el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e3e7ec" }, svg);
      label(svg, L - 6, y(v) + 4, compact(v), { "text-anchor": "end" });
    }
    timeTicks(svg, x, t0, t1, H - B);
    names.forEach(function (p) {
      var values = series[p[0]];
      var points = values.map(function (val, i) {
        return x(t0 + (i + 0.5) * series.bucket_ms).toFixed(1) + "," + y(val).toFixed(1);
      });
      if (p[0] === "attempts") {
        var area = "M" + x(t0).toFixed(1) + "," + y(0) + " L" + points.join(" L") +
          " L" + x(t1).toFixed(1) + "," + y(0) + " Z";
        el("path", { d: area, fill: COLORS.attempts, "fill-opacity": 0.12, stroke: "none" }, svg);
      }
      var line = el("polyline", { points: points.join(" "), fill: "none", stroke: COLORS[p[0]],
        "stroke-width": 1.6, "data-series": p[0] }, svg);
      if (p[0] === "attacker") { line.setAttribute("stroke-dasharray", "4 3"); }
      tip(line, p[1] + ": " + number(values.reduce(function (a, b) { return a + b; }, 0)) + " in total");
    });
    var cut = series.trimmed || {};
    if (cut.first || cut.last) {
      html("p", { "class": "note", "data-note": "trimmed" }, container,
           "Whole " + series.bucket_label + " buckets only: the " +
           (cut.first && cut.last ? "first and last buckets" : cut.first ? "first bucket" : "last bucket") +
           ", which the run covers only in part, are left out (" + number(cut.events) +
           " attempts) so the line does not drop at the edges.");
    }
    return svg;
  }

  // Alerts of one lane less than this many pixels after the previous one join its group,
  // drawn as one mark (a band when the group spans time) with a count: room for the label.
  var CLUSTER_PX = 40;
  function clusters(alerts, x) {
    var byLane = {};
    alerts.forEach(function (a) { (byLane[a.type] = byLane[a.type] || []).push(a); });
    var out = [];
    Object.keys(byLane).forEach(function (type) {
      var group = null;
      byLane[type].sort(function (a, b) { return a.t - b.t; }).forEach(function (a) {
        if (group && x(a.t) - x(group.last) < CLUSTER_PX) {
          group.items.push(a); group.last = a.t;
        } else {
          group = { type: type, first: a.t, last: a.t, items: [a] };
          out.push(group);
        }
      });
    });
    return out;
  }

  function timelineChart(container, data, name) {
    var lanes = data.lanes;
    var W = 1100, L = 235, R = 16, T = 8, ROW = 24, B = 40;
    var H = T + Math.max(lanes.length, 1) * ROW + B;
    legend(container, [["block (issued to expiry)", COLORS.block], ["observe-only decision", COLORS.observe],
                       ["alert (\u00d7n: n alerts close together, the band spans them)", COLORS.alert]]);
    var svg = svgRoot(container, W, H, name || "timeline");
    var t0 = data.range.start_ms, t1 = Math.max(data.range.end_ms, t0 + 1);
    var x = function (t) { return L + (W - L - R) * (Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0); };
    var laneY = {}, counts = {};
    data.decisions.forEach(function (d) { counts[d.rule] = (counts[d.rule] || 0) + 1; });
    data.alerts.forEach(function (a) { counts["alert: " + a.type] = (counts["alert: " + a.type] || 0) + 1; });
    lanes.forEach(function (name, i) {
      laneY[name] = T + i * ROW;
      el("rect", { x: L, y: T + i * ROW, width: W - L - R, height: ROW, fill: i % 2 ? "#ffffff" : "#eef1f4" }, svg);
      label(svg, L - 8, T + i * ROW + 16, name + " (" + number(counts[name] || 0) + ")",
            { "text-anchor": "end", "class": "title" });
    });
    timeTicks(svg, x, t0, t1, T + lanes.length * ROW);
    data.decisions.forEach(function (d) {
      var x0 = x(d.t), x1 = Math.max(x(d.until), x0 + 2);
      var bar = el("rect", { x: x0, y: laneY[d.rule] + 5, width: x1 - x0, height: ROW - 10, rx: 2,
        fill: COLORS[d.action] || COLORS.block, "fill-opacity": 0.35, "data-decision": d.rule }, svg);
      tip(bar, d.rule + " " + d.action + " " + clock(d.t) + " to " + clock(d.until) +
          (d.attack ? " (" + d.attack + ")" : ""));
    });
    clusters(data.alerts, x).forEach(function (g) {
      var cx = x(g.first), cy = laneY["alert: " + g.type] + ROW / 2, n = g.items.length;
      var end = x(g.last);
      if (end - cx >= 1) {
        el("rect", { x: cx, y: cy - 3, width: end - cx, height: 6, rx: 3, fill: COLORS.alert,
          "fill-opacity": 0.45, "data-alert-span": g.type }, svg);
      }
      var mark = el("path", { d: "M" + cx + "," + (cy - 6) + " l6,6 l-6,6 l-6,-6 Z", fill: COLORS.alert,
        stroke: "#9c640c", "stroke-width": 0.6, "data-alert": g.type, "data-alerts": n }, svg);
      var first = g.items[0];
      tip(mark, n === 1 ? g.type + " " + clock(g.first) + " " + (first.subject || "") + " count " + first.count
                        : n + " " + g.type + " alerts " + clock(g.first) + " to " + clock(g.last));
      if (n > 1) { label(svg, end + 8, cy + 4, "\u00d7" + n, { "class": "count" }); }
    });
    html("p", { "class": "note", "data-note": "overlap" }, container,
         "Each bar is one decision, from issue to expiry (the lane's count in brackets). Bars are " +
         "translucent: where a bar is darker, several decisions overlap in time, e.g. one block per " +
         "attacked account or source. Hover a bar or mark for its details.");
    if (data.decisions_truncated) {
      html("p", { "class": "note" }, container, data.decisions_truncated + " more decisions not drawn");
    }
    return svg;
  }

  // A busy run the whole-span charts squeeze (a mixed hour after a patient attacker's day)
  // drawn again on its own time axis: its traffic, and the decisions and alerts in it.
  function zoomSection(container, data) {
    var total = 0;
    data.zooms.forEach(function (zoom, i) {
      var r = zoom.range, box = html("div", { "data-zoom": i, "data-zoom-start": r.start_ms,
        "data-zoom-end": r.end_ms }, container);
      html("h3", {}, box, stamp(r.start_ms) + " to " + stamp(r.end_ms) + ": " + number(zoom.events) +
           " attempts in " + seconds(r.end_ms - r.start_ms));
      trafficChart(box, zoom.series, "traffic-zoom");
      timelineChart(box, Object.assign({}, data, { range: r, lanes: zoom.lanes, decisions: zoom.decisions,
        alerts: zoom.alerts, decisions_truncated: zoom.decisions_truncated }), "timeline-zoom");
      total++;
    });
    document.body.setAttribute("data-zooms-rendered", String(total));
  }

  var ROLE_NAMES = { attacker: "attacker", legit: "legitimate user", owner: "account owner",
                     unknown: "unlabelled" };
  function roleLegend(container, rows) {
    var seen = {};
    rows.forEach(function (r) { seen[r.role] = true; });
    var items = Object.keys(ROLE_NAMES).filter(function (r) { return seen[r]; }).map(function (r) {
      return ["mostly " + ROLE_NAMES[r], COLORS[r]];
    });
    if (rows.some(function (r) { return r.takeover; })) { items.push(["taken over by an attacker", "#000"]); }
    if (items.length) {
      var box = html("div", { "class": "legend", "data-legend": "roles" }, container);
      items.forEach(function (item) { html("span", { style: "--swatch:" + item[1] }, box, item[0]); });
      html("span", { "class": "plain" }, box, "(bar colour: who made most of the failures, from the ground truth)");
    }
  }

  function barChart(container, rows, name, valueLabel, width) {
    var W = width || 540, L = 230, R = 60, ROW = 20, T = 6;
    var H = T + Math.max(rows.length, 1) * ROW + 6;
    if (name !== "alerts") { roleLegend(container, rows); }
    var svg = svgRoot(container, W, H, name);
    var top = niceMax(Math.max.apply(null, rows.map(function (r) { return r.value; }).concat([1])));
    rows.forEach(function (r, i) {
      var y = T + i * ROW;
      var w = Math.max((W - L - R) * r.value / top, 1);
      label(svg, L - 6, y + 14, r.label.length > 34 ? r.label.slice(0, 33) + "\u2026" : r.label,
            { "text-anchor": "end", "class": "title" });
      var bar = el("rect", { x: L, y: y + 3, width: w, height: ROW - 6, rx: 2,
        fill: COLORS[r.role] || COLORS.unknown, "data-bar": r.role }, svg);
      tip(bar, r.label + ": " + number(r.value) + " " + valueLabel + (r.note ? " (" + r.note + ")" : "") +
          (r.takeover ? "; TAKEN OVER" : ""));
      label(svg, L + w + 5, y + 14, compact(r.value));
      if (r.takeover) {
        bar.setAttribute("stroke", "#000"); bar.setAttribute("stroke-width", 2);
        bar.setAttribute("data-takeover", "1");
        label(svg, 4, y + 14, "\u26a0", { "class": "takeover" });
      }
    });
    if (!rows.length) { label(svg, L, T + 14, "no failures"); }
    return svg;
  }

  function table(container, head, rows, numeric) {
    var t = html("table", {}, container);
    var tr = html("tr", {}, html("thead", {}, t));
    head.forEach(function (h, i) { html("th", numeric[i] ? { "class": "num" } : {}, tr, h); });
    var body = html("tbody", {}, t);
    rows.forEach(function (row) {
      var r = html("tr", {}, body);
      row.forEach(function (cell, i) {
        var text = cell === null ? "-" : head[i] === "status" ? String(cell).replace("_", " ") : String(cell);
        var td = html("td", numeric[i] ? { "class": "num" } : {}, r, text);
        if (head[i] === "status") { td.className = "status-" + cell; }
        if (head[i] === "takeovers" && cell > 0) { r.className = "takeover"; td.className = "num bad"; }
      });
    });
    return t;
  }

  function seconds(ms) {
    if (ms === null || ms === undefined) { return "-"; }
    return ms < 60000 ? (ms / 1000).toFixed(1) + " s" : (ms / 60000).toFixed(1) + " min";
  }

  function scorecardSection(container, card) {
    if (!card) { html("p", { "class": "note" }, container, "no scorecard: give a truth file with labels"); return; }
    table(container,
      ["attack", "tenant", "attempts", "first response", "by", "got through before", "refused", "allowed", "takeovers", "status"],
      card.attacks.map(function (a) {
        return [a.attack, a.tenant, number(a.attempts), seconds(a.time_to_response_ms), a.response_by,
                number(a.allowed_before_response), number(a.refused), number(a.allowed),
                a.successes_allowed, a.status];
      }),
      [false, false, true, true, false, true, true, true, true, false]);
    if (card.summary) {
      html("p", { "class": card.account_takeovers ? "bad" : "summary", "data-summary": "1" }, container, card.summary);
    }
    html("p", { "class": "note" }, container, "status: stopped = blocks refused it, no account taken " +
         "over, at most 10 % of its attempts after the first response got through; slowed = refused " +
         "in part, or an account was taken over; detected only = alerted or observed, nothing refused; " +
         "missed = nothing.");
    var legit = card.legitimate;
    var p = html("p", {}, container);
    html("span", { "class": legit.refused ? "bad" : "good" }, p,
         number(legit.refused) + " of " + number(legit.attempts) + " legitimate attempts refused");
    p.appendChild(document.createTextNode(" (" + Object.keys(legit.by_cohort).map(function (c) {
      return c + " " + legit.by_cohort[c].refused + "/" + number(legit.by_cohort[c].attempts);
    }).join(", ") + "). " + card.alerts_matching_no_attack.length + " alerts and " +
      card.blocks_matching_no_attack.length + " blocks matched no attack."));
    card.alerts_matching_no_attack.forEach(function (a) {
      html("p", { "class": "note" }, container, "unmatched " + a.type + " " +
           (a.source || a.account_digest || a.tenant) + " at " + a.at + ": " + a.note);
    });
  }

  function takeoverSection(container, data) {
    if (!data.takeovers || !data.takeovers.length) { return; }
    var total = data.takeovers.reduce(function (a, t) { return a + t.successes; }, 0);
    var box = html("div", { "class": "takeovers", "data-takeovers": data.takeovers.length }, container);
    html("strong", {}, box, "\u26a0 " + number(data.takeovers.length) + " accounts taken over (" +
         number(total) + " attacker logins allowed): ");
    box.appendChild(document.createTextNode(data.takeovers.map(function (t) {
      return t.account + (t.tenant !== "default" ? " (" + t.tenant + ")" : "");
    }).join(", ")));
  }

  function alertsSection(container, data) {
    var types = Object.keys(data.alerts_by_type).sort();
    var rows = types.map(function (t) { return { label: t, value: data.alerts_by_type[t], role: "attacker" }; });
    barChart(container, rows, "alerts", "alerts", 1100);
    var recent = data.alerts.slice(0, 12).map(function (a) {
      return [stamp(a.t), a.type, a.subject || "-", number(a.count), a.matched || "no attack"];
    });
    table(container, ["time", "type", "subject", "count", "matched"], recent, [false, false, false, true, false]);
    if (data.alerts.length > 12) {
      html("p", { "class": "note" }, container, "first 12 of " + number(data.alerts.length) + " alerts");
    }
  }

  function run() {
    var data = JSON.parse(document.getElementById("report-data").textContent);
    var rendered = 0;
    trafficChart(document.getElementById("traffic"), data.series); rendered++;
    timelineChart(document.getElementById("timeline"), data); rendered++;
    if (data.zooms && data.zooms.length) { zoomSection(document.getElementById("zooms"), data); }
    barChart(document.getElementById("sources"), data.top_sources, "sources", "failures"); rendered++;
    barChart(document.getElementById("accounts"), data.top_accounts, "accounts", "failures"); rendered++;
    alertsSection(document.getElementById("alerts"), data); rendered++;
    takeoverSection(document.getElementById("scorecard"), data);
    scorecardSection(document.getElementById("scorecard"), data.scorecard); rendered++;
    document.body.setAttribute("data-charts-rendered", String(rendered));
  }

  try {
    run();
  } catch (err) {
    reportError((err && err.stack) || String(err));
  }
})();
