'use strict';
// memgap's report: reads the JSON embedded in the page and draws each panel.
// Every string from the trace reaches the DOM through textContent (or a
// canvas), never as HTML.
window.addEventListener('error', (e) => document.body.setAttribute('data-error', String(e.message)));
window.addEventListener('unhandledrejection', (e) => document.body.setAttribute('data-error', String(e.reason)));

(function () {
  const $ = (id) => document.getElementById(id);
  const data = JSON.parse($('data').textContent);
  const snapshots = data.snapshots;
  const summary = data.summary;
  const params = new URLSearchParams(location.hash.includes('=') ? location.hash.slice(1) : '');

  const ROWS = ['live', 'slack', 'fragmented', 'retained', 'lazy_free', 'runtime', 'other'];
  // The colours come with the data (crates/views/src/palette.rs): one per ledger row, in every panel and the terminal.
  const PALETTE = data.palette;
  const ROW_COLOURS = PALETTE.rows;
  const ROW_MEANING = {
    live: 'bytes the program requested and holds', slack: 'headers, alignment, rounding inside live blocks',
    fragmented: 'free bytes on pages that hold live blocks', retained: 'resident pages with no live block',
    lazy_free: "MADV_FREE'd, still counted", runtime: 'thread stacks', other: 'files, shared memory, own mmaps, static data (and memgap\u2019s own memory, shown apart)',
  };

  function fmtBytes(v) {
    if (Math.abs(v) < 1024) return Math.round(v) + ' B';
    const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let i = -1;
    do { v /= 1024; i++; } while (Math.abs(v) >= 1024 && i < units.length - 1);
    return v.toFixed(Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2) + ' ' + units[i];
  }
  const fmtSeconds = (s) => (s < 1 ? (s * 1000).toFixed(0) + ' ms' : s.toFixed(2) + ' s');
  const fmtCount = (n) => Math.round(n).toLocaleString('en-US');
  const percent = (part, whole) => (whole > 0 ? (part * 100 / whole).toFixed(1) + ' %' : '');

  // Text whose `quoted` parts are commands or code: those go in <code>, all as text.
  function withCode(node, text) {
    node.textContent = '';
    String(text).split('`').forEach((part, i) => node.append(i % 2 ? el('code', part) : part));
    return node;
  }
  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  const tooltip = $('tooltip');
  function showTip(event, text) {
    tooltip.textContent = text;
    tooltip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - tooltip.offsetWidth - 4);
    const y = event.clientY + 16 + tooltip.offsetHeight > window.innerHeight ? event.clientY - tooltip.offsetHeight - 8 : event.clientY + 16;
    tooltip.style.left = Math.max(0, x) + 'px';
    tooltip.style.top = Math.max(0, y) + 'px';
  }
  const hideTip = () => { tooltip.hidden = true; };

  // A canvas sized to its box in CSS pixels, drawn at the screen's density.
  function prepare(canvas, height) {
    const width = canvas.parentElement.clientWidth || 800;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = height + 'px';
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    return { ctx, width, height };
  }
  function mouse(canvas, event) {
    const r = canvas.getBoundingClientRect();
    return { x: event.clientX - r.left, y: event.clientY - r.top };
  }
  /** One malloc_trim call, as the timeline's hover shows it: "malloc_trim: 412 MiB → 38 MiB at 2.5 s". */
  function trimTitle(m) {
    return 'malloc_trim' + (m.pad_bytes ? '(' + fmtBytes(m.pad_bytes) + ')' : '') + ': ' + trimChange(m);
  }
  function trimChange(m) {
    return fmtBytes(m.rss_before_bytes) + ' \u2192 ' + fmtBytes(m.rss_after_bytes) + ' at ' + fmtSeconds(m.seconds) + (m.returned ? '' : ' (returned 0: nothing released)');
  }
  // Entries: [colour, name, title, 'line' for a line's swatch].
  function legend(container, entries) {
    for (const [colour, name, title, kind] of entries) {
      const item = el('span', name);
      const swatch = el('i', null, kind === 'line' ? 'line' : null);
      swatch.style.background = colour;
      item.prepend(swatch);
      if (title) item.title = title;
      container.append(item);
    }
  }

  // ---- header and verdict ----------------------------------------------
  document.title = 'memgap: ' + summary.command;
  $('command').textContent = summary.command;
  const facts = [
    'pid ' + summary.pid, fmtSeconds(summary.duration_seconds), fmtCount(summary.total_events) + ' calls',
    'peak RSS ' + fmtBytes(summary.peak_rss_bytes), 'peak live heap ' + fmtBytes(summary.peak_live_bytes) + ' (malloc\u2019s, at ' + fmtSeconds(summary.peak_live_seconds) + ')',
    snapshots.length + ' snapshots', 'trace ' + data.trace,
  ];
  if (summary.exit_code !== null) facts.push('exit ' + summary.exit_code);
  if (summary.truncated) facts.push('cut short: ' + summary.truncated_reason);
  $('facts').textContent = facts.join(' · ');

  const moment = snapshots[data.moment.index];
  $('verdict-at').textContent = data.moment.line;
  if (moment) {
    withCode($('verdict-text'), moment.verdict);
    const numbers = [
      [fmtBytes(moment.rss), 'RSS at ' + fmtSeconds(moment.seconds), '#ledger'],
      [fmtBytes(moment.rows.live), 'live', '#blame'],
      [fmtBytes(moment.rows.fragmented), 'fragmented (' + percent(moment.rows.fragmented, moment.rss) + ')', '#pagemap'],
      [fmtBytes(moment.rows.retained), 'retained (' + percent(moment.rows.retained, moment.rss) + ')', '#pagemap'],
      [fmtBytes(moment.trim), 'malloc_trim would return', '#ledger'],
      [fmtBytes(moment.rows.other - moment.memgap), 'other', '#ledger'],
      [fmtBytes(moment.memgap), 'memgap’s own (not the program’s)', '#ledger'],
      [String(moment.arenas), 'glibc arenas', '#ledger'],
    ];
    for (const [value, label, href] of numbers) {
      const box = el('div');
      const link = el('a', value);
      link.href = href;
      box.append(el('b'), el('span', label));
      box.firstChild.append(link);
      $('verdict-numbers').append(box);
    }
    ownersPanel(moment);
    remediesPanel(moment);
    $('verdict').setAttribute('data-ready', 'true');
  } else {
    $('verdict-text').textContent = 'The trace has no snapshot.';
  }

  // Each owner's share of RSS: one bar per owner, its rows stacked.
  function ownersPanel(s) {
    const owners = s.owners || [];
    if (!owners.length) return;
    const box = $('owners-bars');
    for (const o of owners) {
      const total = ROWS.reduce((sum, row) => sum + (o.rows[row] || 0), 0);
      const line = el('div', null, 'owner-line');
      const name = el('span', o.owner + (o.owner === s.gap_owner ? ' (holds the gap)' : ''), 'owner-name');
      const bar = el('span', null, 'owner-bar');
      for (const row of ROWS) {
        const bytes = o.rows[row] || 0;
        if (!bytes) continue;
        const part = el('span', null, 'owner-part');
        part.style.width = (bytes * 100 / Math.max(1, s.rss)) + '%';
        part.style.background = ROW_COLOURS[row];
        part.addEventListener('mousemove', (e) => showTip(e, o.owner + ' ' + row + ': ' + fmtBytes(bytes) + ' (' + percent(bytes, s.rss) + ' of RSS)'));
        part.addEventListener('mouseleave', hideTip);
        bar.append(part);
      }
      const figure = el('span', fmtBytes(total) + ' (' + percent(total, s.rss) + ')' + (o.rows.live ? ', live ' + fmtBytes(o.rows.live) : ''), 'owner-figure');
      line.append(name, bar, figure);
      box.append(line);
      if (o.estimated) box.append(el('p', o.owner + ': ' + o.estimated + '.', 'owner-note'));
    }
    $('owners-panel').dataset.owners = owners.length;
    $('owners-panel').hidden = false;
  }

  // The remedies, best first, with the environment to run the program with
  // and what memgap compare measured of them.
  function remediesPanel(s) {
    const remedies = s.remedies || [];
    if (!remedies.length) return;
    const body = $('remedies-table').tBodies[0];
    for (const r of remedies) {
      const env = Object.entries(r.env || {}).map(([k, v]) => k + '=' + v).join(' ');
      const tr = el('tr');
      const how = el('td');
      how.append(env ? el('code', env) : el('span', 'a change to the program'));
      const m = r.measured;
      const measured = m ? m.metric + ' RSS ' + fmtBytes(m.default_bytes) + ' \u2192 ' + fmtBytes(m.bytes) + ' (' + m.outcome + ', ' + m.runs + ' runs)' : 'not measured';
      const title = el('td');
      title.append(el('b', r.id), el('div', r.description, 'remedy-description'));
      tr.append(title, el('td', r.owner), how, el('td', fmtBytes(r.expected_savings_bytes), 'num'), el('td', measured, m ? 'measured-' + m.outcome.replace(' ', '-') : ''));
      body.append(tr);
    }
    $('remedies-panel').dataset.remedies = remedies.length;
    $('remedies-panel').hidden = false;
  }

  let selected = params.has('snapshot') ? Math.max(0, Math.min(snapshots.length - 1, parseInt(params.get('snapshot'), 10) || 0)) : data.moment.index;

  // ---- timeline ------------------------------------------------------------
  // Three things over time, each drawn only where it was measured: the live
  // heap after every malloc and free (a line, each bucket's low and high
  // kept), VmRSS at every sample (a line), and the ledger rows stacked in a
  // short bar at each snapshot (nothing is known of them between snapshots).
  const timeline = (function () {
    const canvas = $('timeline-canvas');
    const trims = data.trims || [];
    const live = data.live_heap || [];
    const TRIM_COLOUR = '#009e9e';
    const SELECTED_COLOUR = '#1d2330';
    const GC_COLOUR = '#8a3ffc';
    const BAR_WIDTH = 12;
    // Where a runtime keeps a heap of its own, the line sees only malloc's part of the live row.
    const mallocOnly = snapshots.some((s) => {
      const line = valueAt(live, s.seconds);
      return line && s.rows.live - line[1] > Math.max(1 << 20, s.rows.live / 10);
    });
    legend($('timeline-legend'), ROWS.map((r) => [ROW_COLOURS[r], r, ROW_MEANING[r] + ' (a bar at each snapshot)'])
      .concat(snapshots.some((s) => s.memgap > 0) ? [[PALETTE.memgap, 'memgap\u2019s own', 'memgap\u2019s buffers, heap, static data and code, part of other on top of it: not the program\u2019s, left out of the verdict and the gap']] : [])
      .concat(live.length ? [[ROW_COLOURS.live, mallocOnly ? 'live heap (malloc\u2019s part)' : 'live heap', 'the bytes the program holds from malloc after every malloc and free, from the trace\u2019s events'
        + (mallocOnly ? '; a runtime\u2019s own heap (Ruby\u2019s object pages, pymalloc\u2019s arenas) is measured at snapshots only, in the bars' : ''), 'line']] : [])
      .concat([[PALETTE.vm_rss, 'VmRSS', 'the kernel\u2019s resident set size, at every sample', 'line']])
      .concat((data.gc || []).length ? [[GC_COLOUR, 'GC', 'a collection of the program\u2019s runtime (tall: major)']] : [])
      .concat(trims.length ? [[TRIM_COLOUR, 'malloc_trim', 'the program called malloc_trim: an arrow from VmRSS before the call to VmRSS after it'
        + (data.trim_calls > trims.length ? ' (' + fmtCount(trims.length) + ' of ' + fmtCount(data.trim_calls) + ' calls shown: those that released most)' : '')]] : []));
    const rss = data.rss;
    if (trims.length) {
      // In words too: the call that released most (the arrows are small on a long run).
      const largest = trims.reduce((a, b) => (b.rss_before_bytes - b.rss_after_bytes > a.rss_before_bytes - a.rss_after_bytes ? b : a));
      const calls = data.trim_calls || trims.length;
      $('timeline-trims').textContent = 'The program called ' + (calls === 1 ? trimTitle(largest) : 'malloc_trim ' + fmtCount(calls) + ' times; the largest release: ' + trimChange(largest)) + '.';
      $('timeline-trims').hidden = false;
    }
    const last = (series) => (series.length ? series[series.length - 1][0] : 0);
    let maxT = Math.max(summary.duration_seconds || 0, last(rss), last(live), snapshots.length ? snapshots[snapshots.length - 1].seconds : 0) || 1;
    let maxY = 1;
    for (const s of snapshots) maxY = Math.max(maxY, s.rss, ROWS.reduce((sum, r) => sum + s.rows[r], 0));
    for (const [, v] of rss) maxY = Math.max(maxY, v);
    for (const [, v] of live) maxY = Math.max(maxY, v);
    for (const m of trims) { maxY = Math.max(maxY, m.rss_before_bytes, m.rss_after_bytes); maxT = Math.max(maxT, m.seconds); }
    maxY *= 1.05;
    const view = { t0: 0, t1: maxT };
    let drag = null;
    // The plot keeps half a bar of room at each end: the exit snapshot's bar is whole.
    const M = { left: 72, right: 12 + BAR_WIDTH, top: 22, bottom: 26 };
    let geometry = null;

    // Each snapshot's bar: centred on its time, narrower when snapshots crowd.
    function bars(x) {
      return snapshots.map((s, i) => {
        const cx = x(s.seconds);
        let room = BAR_WIDTH;
        if (i > 0) room = Math.min(room, (cx - x(snapshots[i - 1].seconds)) * 0.8);
        if (i + 1 < snapshots.length) room = Math.min(room, (x(snapshots[i + 1].seconds) - cx) * 0.8);
        const w = Math.max(2, room);
        return { x0: cx - w / 2, w };
      });
    }
    function draw() {
      const { ctx, width, height } = prepare(canvas, 320);
      const plotW = width - M.left - M.right, plotH = height - M.top - M.bottom;
      const x = (t) => M.left + (t - view.t0) / (view.t1 - view.t0) * plotW;
      const y = (v) => M.top + plotH - v / maxY * plotH;
      geometry = { x, plotW };
      ctx.fillStyle = '#fff';
      ctx.fillRect(0, 0, width, height);
      ctx.font = '11px system-ui, sans-serif';
      ctx.fillStyle = '#556';
      ctx.strokeStyle = '#eceef2';
      ctx.textAlign = 'right';
      for (let i = 0; i <= 5; i++) {
        const v = maxY * i / 5;
        ctx.beginPath(); ctx.moveTo(M.left, y(v)); ctx.lineTo(width - M.right + BAR_WIDTH / 2, y(v)); ctx.stroke();
        ctx.fillText(fmtBytes(v), M.left - 6, y(v) + 4);
      }
      ctx.textAlign = 'center';
      for (let i = 0; i <= 6; i++) {
        const t = view.t0 + (view.t1 - view.t0) * i / 6;
        ctx.fillText(fmtSeconds(t), x(t), height - 8);
      }
      ctx.save();
      ctx.beginPath(); ctx.rect(M.left - BAR_WIDTH / 2, M.top, plotW + BAR_WIDTH, plotH); ctx.clip();
      // The rows, stacked in a bar at each snapshot.
      const shape = bars(x);
      let exitWidth = 0;
      snapshots.forEach((s, i) => {
        const { x0, w } = shape[i];
        if (x0 + w < M.left - BAR_WIDTH || x0 > width) return;
        let base = 0;
        for (const row of ROWS) {
          const v = s.rows[row];
          // memgap's own memory, part of other, on top in its own colour.
          const own = row === 'other' ? Math.min(v, s.memgap || 0) : 0;
          if (v - own > 0) {
            ctx.fillStyle = ROW_COLOURS[row];
            ctx.fillRect(x0, y(base + v - own), w, y(base) - y(base + v - own));
          }
          if (own > 0) {
            ctx.fillStyle = PALETTE.memgap;
            ctx.fillRect(x0, y(base + v), w, y(base + v - own) - y(base + v));
          }
          base += v;
        }
        if (i === selected) {
          ctx.strokeStyle = SELECTED_COLOUR; ctx.lineWidth = 2;
          ctx.strokeRect(x0 - 1, y(base) - 1, w + 2, y(0) - y(base) + 2);
        }
        if (i === snapshots.length - 1) exitWidth = w;
      });
      canvas.setAttribute('data-exit-bar-width', exitWidth.toFixed(1));
      // The live heap, from every event.
      let livePoints = 0;
      if (live.length) {
        ctx.strokeStyle = ROW_COLOURS.live; ctx.lineWidth = 1.5; ctx.lineJoin = 'round';
        ctx.beginPath();
        // A step line: the live heap holds its value until the next event.
        let previous = null;
        for (const [t, v] of live) {
          if (previous === null) ctx.moveTo(x(t), y(v)); else { ctx.lineTo(x(t), y(previous)); ctx.lineTo(x(t), y(v)); }
          previous = v;
          if (t >= view.t0 && t <= view.t1) livePoints++;
        }
        // After the last event the live heap holds until the process ends.
        const end = Math.max(last(rss), snapshots.length ? snapshots[snapshots.length - 1].seconds : 0);
        if (end > last(live)) ctx.lineTo(x(end), y(previous));
        ctx.stroke();
      }
      canvas.setAttribute('data-live-points', String(livePoints));
      ctx.strokeStyle = PALETTE.vm_rss;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      for (const [t, v] of rss) ctx.lineTo(x(t), y(v));
      ctx.stroke();
      ctx.restore();
      // The runtime's collections: a tall tick for a major one, a short one for a minor one.
      let gcDrawn = 0;
      for (const g of data.gc || []) {
        const gx = x(g.seconds);
        if (gx < M.left || gx > width - M.right) continue;
        ctx.strokeStyle = g.major ? GC_COLOUR : GC_COLOUR + '88';
        ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(gx, M.top); ctx.lineTo(gx, M.top + (g.major ? 14 : 6)); ctx.stroke();
        gcDrawn++;
      }
      canvas.setAttribute('data-gc-marks', String(gcDrawn));
      // The program's malloc_trim calls: an arrow from VmRSS before the call down (or up) to VmRSS after it.
      let trimsDrawn = 0;
      for (const m of trims) {
        const tx = x(m.seconds);
        if (tx < M.left || tx > width - M.right) continue;
        const y0 = y(m.rss_before_bytes), y1 = y(m.rss_after_bytes);
        const head = y1 >= y0 ? -1 : 1;
        ctx.strokeStyle = TRIM_COLOUR; ctx.fillStyle = TRIM_COLOUR; ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(tx, y0); ctx.lineTo(tx, y1); ctx.stroke();
        ctx.beginPath(); ctx.moveTo(tx, y1); ctx.lineTo(tx - 5, y1 + head * 7); ctx.lineTo(tx + 5, y1 + head * 7); ctx.closePath(); ctx.fill();
        ctx.beginPath(); ctx.arc(tx, y0, 3, 0, 2 * Math.PI); ctx.fill();
        trimsDrawn++;
      }
      canvas.setAttribute('data-trim-marks', String(trimsDrawn));
      // The selected moment: a dashed line and its time above the plot; snapshot markers below (filled: with a page map).
      snapshots.forEach((s, i) => {
        const sx = x(s.seconds);
        if (sx < M.left - BAR_WIDTH || sx > width - M.right + BAR_WIDTH) return;
        if (i === selected) {
          ctx.strokeStyle = SELECTED_COLOUR; ctx.setLineDash([4, 3]); ctx.lineWidth = 1;
          ctx.beginPath(); ctx.moveTo(sx, M.top); ctx.lineTo(sx, M.top + plotH); ctx.stroke(); ctx.setLineDash([]);
          const why = i === data.moment.index ? data.moment.reason : i === data.peak && s.reason !== 'rss peak' ? 'the RSS peak' : '';
          const label = 'selected: snapshot ' + i + ' at ' + fmtSeconds(s.seconds) + ' (' + s.reason + ' snapshot' + (why ? '; ' + why : '') + ')';
          ctx.font = 'bold 11px system-ui, sans-serif';
          const w = ctx.measureText(label).width;
          ctx.textAlign = sx + w / 2 > width - 2 ? 'right' : sx - w / 2 < 2 ? 'left' : 'center';
          ctx.fillStyle = SELECTED_COLOUR;
          ctx.fillText(label, ctx.textAlign === 'right' ? sx + 4 : ctx.textAlign === 'left' ? sx - 4 : sx, M.top - 8);
          canvas.setAttribute('data-selected', String(i));
        }
        ctx.beginPath();
        ctx.moveTo(sx, M.top + plotH - 8); ctx.lineTo(sx - 5, M.top + plotH); ctx.lineTo(sx + 5, M.top + plotH); ctx.closePath();
        ctx.fillStyle = i === selected ? SELECTED_COLOUR : '#8a8f9c';
        ctx.strokeStyle = ctx.fillStyle;
        if (s.pagemap) ctx.fill(); else { ctx.lineWidth = 1; ctx.stroke(); }
      });
      if (drag && drag.x1 !== undefined) {
        ctx.fillStyle = ROW_COLOURS.live + '33';
        ctx.fillRect(Math.min(drag.x0, drag.x1), M.top, Math.abs(drag.x1 - drag.x0), plotH);
      }
      liveNote();
      canvas.setAttribute('data-drawn', String(Number(canvas.getAttribute('data-drawn') || 0) + 1));
    }
    // The line counts malloc's blocks; a runtime's own heap (Ruby's object
    // pages, pymalloc's arenas) is in the live row of the snapshots only.
    function liveNote() {
      const note = $('timeline-live-note');
      const s = snapshots[selected];
      const line = s && valueAt(live, s.seconds);
      const apart = line ? s.rows.live - line[1] : 0;
      note.hidden = !(line && apart > Math.max(1 << 20, s.rows.live / 10));
      if (note.hidden) return;
      const owners = (s.owners || []).filter((o) => o.rows.live > 0).map((o) => o.owner + ' ' + fmtBytes(o.rows.live));
      note.textContent = 'At the selected snapshot the live row holds ' + fmtBytes(s.rows.live) + ' and the live heap line ' + fmtBytes(line[1])
        + ': the line follows malloc’s blocks at every event; the other ' + fmtBytes(apart) + ' is in a runtime’s own heap, which only the snapshots measure'
        + (owners.length ? ' (live by owner: ' + owners.join(', ') + ')' : '') + '.';
    }
    const timeAt = (px) => view.t0 + (px - M.left) / geometry.plotW * (view.t1 - view.t0);
    function nearestSnapshot(px) {
      let best = -1, bestDistance = 12;
      snapshots.forEach((s, i) => {
        const d = Math.abs(geometry.x(s.seconds) - px);
        if (d < bestDistance) { best = i; bestDistance = d; }
      });
      return best;
    }
    function nearestTrim(px) {
      let best = null, bestDistance = 6;
      for (const m of trims) {
        const d = Math.abs(geometry.x(m.seconds) - px);
        if (d < bestDistance) { best = m; bestDistance = d; }
      }
      return best;
    }
    // The last point of a series at or before t (the first one before it begins).
    function valueAt(series, t) {
      let lo = 0, hi = series.length;
      if (!hi) return null;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (series[mid][0] <= t) lo = mid + 1; else hi = mid; }
      return series[Math.max(0, lo - 1)];
    }
    canvas.addEventListener('mousedown', (e) => { drag = { x0: mouse(canvas, e).x }; e.preventDefault(); });
    canvas.addEventListener('mousemove', (e) => {
      const p = mouse(canvas, e);
      if (drag) { drag.x1 = p.x; draw(); return; }
      const t = timeAt(p.x);
      const lines = [fmtSeconds(Math.max(0, t))];
      const heap = valueAt(live, t);
      if (heap) lines.push('live heap ' + fmtBytes(heap[1]) + ' since ' + fmtSeconds(heap[0]));
      const sample = valueAt(rss, t);
      if (sample) lines.push('VmRSS ' + fmtBytes(sample[1]) + ' at ' + fmtSeconds(sample[0]));
      const trim = nearestTrim(p.x);
      if (trim) lines.push('', trimTitle(trim));
      const i = nearestSnapshot(p.x);
      if (i >= 0) {
        const s = snapshots[i];
        lines.push('', 'snapshot ' + i + ' (' + s.reason + ') at ' + fmtSeconds(s.seconds) + ', RSS ' + fmtBytes(s.rss));
        if (s.memgap > 0) lines.push('  ' + 'memgap\u2019s'.padEnd(11) + fmtBytes(s.memgap).padStart(11) + ' (own, in other)');
        for (const row of ROWS.slice().reverse()) lines.push('  ' + row.padEnd(11) + fmtBytes(s.rows[row]).padStart(11));
        lines.push(i === selected ? 'selected' : 'click to select');
      }
      showTip(e, lines.join('\n'));
    });
    canvas.addEventListener('mouseleave', hideTip);
    window.addEventListener('mouseup', (e) => {
      if (!drag) return;
      const d = drag;
      drag = null;
      if (d.x1 !== undefined && Math.abs(d.x1 - d.x0) > 5) {
        const a = timeAt(Math.min(d.x0, d.x1)), b = timeAt(Math.max(d.x0, d.x1));
        view.t0 = Math.max(0, a); view.t1 = Math.max(view.t0 + 1e-6, b);
        draw();
      } else if (e.target === canvas) {
        const i = nearestSnapshot(d.x0);
        if (i >= 0) select(i); else draw();
      } else {
        draw();
      }
    });
    canvas.addEventListener('dblclick', () => { view.t0 = 0; view.t1 = maxT; draw(); });
    return { draw };
  })();

  // ---- page map --------------------------------------------------------------
  // Page bytes (html.rs page_byte): 0 not resident, 1 free (trim would return
  // it), 2 free (kept), 3 memgap, 4 program mmap, 5..=36 used by fill,
  // 37..=68 a pymalloc arena's by the arena's fill, 69 an arena with no
  // block (the python owner's rows, in the same colours). Each
  // in the colour of the ledger row its bytes fall in: free pages are
  // retained, memgap and program mmaps are other, and a used page goes from
  // the fragmented colour (nearly empty: its free bytes are fragmented) to
  // the live colour (full).
  const rgbOf = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const PAGE_COLOURS = [PALETTE.not_resident, ROW_COLOURS.retained, PALETTE.retained_kept, PALETTE.memgap, ROW_COLOURS.other].map(rgbOf);
  const [EMPTY_PAGE, FULL_PAGE] = [rgbOf(ROW_COLOURS.fragmented), rgbOf(ROW_COLOURS.live)];
  for (let fill = 0; fill < 32; fill++) {
    const f = fill / 31;
    PAGE_COLOURS.push(EMPTY_PAGE.map((c, i) => Math.round(c + (FULL_PAGE[i] - c) * f)));
  }
  PAGE_COLOURS.push(...PAGE_COLOURS.slice(5, 37), rgbOf(PALETTE.retained_kept));
  const cssOf = (rgb) => 'rgb(' + rgb.join(',') + ')';
  function pageClassText(byte) {
    if (byte === 69) return 'pymalloc arena holding no block (python, retained)';
    if (byte >= 37) return 'pymalloc arena (python): allocated blocks take about ' + Math.round((byte - 37) / 31 * 100) + ' % of the arena\u2019s resident bytes, the rest is fragmented';
    if (byte >= 5) return 'used: blocks take about ' + Math.round((byte - 5) / 31 * 100) + ' % of the page';
    return ['not resident (released or never touched)', 'free, resident: malloc_trim would return it', 'free, resident: kept (trim cannot reach it)', 'memgap\u2019s own buffers', 'the program\u2019s own mmap'][byte];
  }
  // Nodes 0..7 in distinct hues; more nodes cycle.
  const NODE_COLOURS = [[66, 133, 244], [219, 68, 55], [15, 157, 88], [244, 180, 0], [171, 71, 188], [0, 172, 193], [255, 112, 67], [124, 179, 66]];
  const NO_NODE = 255;
  const pagemap = (function () {
    const canvas = $('pagemap-canvas');
    const colourBy = $('pagemap-colour');
    const HEIGHT = 480, MARGIN = 8;
    legend($('pagemap-legend'), [
      [cssOf(PAGE_COLOURS[36]), 'used, full (live)'], [cssOf(PAGE_COLOURS[20]), 'used, half full'], [cssOf(PAGE_COLOURS[5]), 'used, nearly empty (fragmented)'],
      [cssOf(PAGE_COLOURS[1]), 'free, trim would return (retained)'], [cssOf(PAGE_COLOURS[2]), 'free, kept (retained)'],
      [cssOf(PAGE_COLOURS[0]), 'not resident'], [cssOf(PAGE_COLOURS[3]), 'memgap (other)'], [cssOf(PAGE_COLOURS[4]), 'program mmap (other)'],
    ].map(([colour, name]) => [colour, name, pageClassText(PAGE_COLOURS.findIndex((c) => cssOf(c) === colour))]));
    const cache = new Map();
    let layout = null;
    let view = null;
    let drag = null;
    let pending = false;

    function decode(blobIndex) {
      if (!cache.has(blobIndex)) {
        const text = $('pages-' + blobIndex).textContent.trim();
        const binary = atob(text);
        const bytes = new Uint8Array(binary.length);
        for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
        const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
        cache.set(blobIndex, new Response(stream).arrayBuffer().then((b) => new Uint8Array(b)));
      }
      return cache.get(blobIndex);
    }
    function nearestWithPages(index) {
      let best = -1;
      snapshots.forEach((s, i) => {
        if (s.pagemap && (best < 0 || Math.abs(s.seconds - snapshots[index].seconds) < Math.abs(snapshots[best].seconds - snapshots[index].seconds))) best = i;
      });
      return best;
    }
    // Pages laid out in rows of `cols` (a power of two), each mapping from
    // a new row, one empty row between mappings; level k of the pyramid
    // averages 2^k x 2^k pages per pixel, for drawing a big heap zoomed out.
    function build(snapshotIndex, bytes, nodes) {
      const pm = snapshots[snapshotIndex].pagemap;
      const width = canvas.parentElement.clientWidth || 800;
      const aspect = (width - 2 * MARGIN) / (HEIGHT - 2 * MARGIN);
      let cols = Math.pow(2, Math.round(Math.log2(Math.sqrt(Math.max(1, pm.bytes) * aspect))));
      cols = Math.max(16, Math.min(4096, cols));
      const maps = [];
      let row = 0;
      for (const m of pm.maps) {
        const rows = Math.max(1, Math.ceil(m.pages / cols));
        maps.push({ name: m.name, start: m.start, pageSize: m.page_size, offset: m.offset, pages: m.pages, row, rows });
        row += rows + 1;
      }
      const rows = Math.max(1, row - 1);
      const base = document.createElement('canvas');
      base.width = cols; base.height = rows;
      const image = base.getContext('2d').createImageData(cols, rows);
      const px = image.data;
      px.fill(255);
      for (const m of maps) {
        for (let i = 0; i < m.pages; i++) {
          const byte = bytes[m.offset + i];
          const node = nodes ? nodes[m.offset + i] : NO_NODE;
          const colour = !nodes || byte === 0 ? PAGE_COLOURS[byte] || PAGE_COLOURS[0] : node === NO_NODE ? [190, 190, 200] : NODE_COLOURS[node % NODE_COLOURS.length];
          const at = ((m.row + Math.floor(i / cols)) * cols + (i % cols)) * 4;
          px[at] = colour[0]; px[at + 1] = colour[1]; px[at + 2] = colour[2];
        }
      }
      base.getContext('2d').putImageData(image, 0, 0);
      const levels = [base];
      let previous = image;
      while (levels.length < 16 && (previous.width > 1 || previous.height > 1)) {
        const w = Math.ceil(previous.width / 2), h = Math.ceil(previous.height / 2);
        const level = document.createElement('canvas');
        level.width = w; level.height = h;
        const next = level.getContext('2d').createImageData(w, h);
        const src = previous.data, dst = next.data, sw = previous.width, sh = previous.height;
        for (let y = 0; y < h; y++) {
          for (let x = 0; x < w; x++) {
            let r = 0, g = 0, b = 0, n = 0;
            for (let dy = 0; dy < 2; dy++) {
              for (let dx = 0; dx < 2; dx++) {
                const sx = 2 * x + dx, sy = 2 * y + dy;
                if (sx >= sw || sy >= sh) continue;
                const at = (sy * sw + sx) * 4;
                r += src[at]; g += src[at + 1]; b += src[at + 2]; n++;
              }
            }
            const at = (y * w + x) * 4;
            dst[at] = r / n; dst[at + 1] = g / n; dst[at + 2] = b / n; dst[at + 3] = 255;
          }
        }
        level.getContext('2d').putImageData(next, 0, 0);
        levels.push(level);
        previous = next;
      }
      return { snapshotIndex, bytes, nodes, cols, rows, maps, levels };
    }
    function fit() {
      const width = canvas.parentElement.clientWidth || 800;
      const scale = Math.min((width - 2 * MARGIN) / layout.cols, (HEIGHT - 2 * MARGIN) / layout.rows);
      return { scale, fitScale: scale, ox: MARGIN, oy: MARGIN };
    }
    function draw() {
      pending = false;
      const { ctx, width, height } = prepare(canvas, HEIGHT);
      ctx.fillStyle = '#f7f8fa';
      ctx.fillRect(0, 0, width, height);
      if (!layout) return;
      const { scale, ox, oy } = view;
      const level = scale < 1 ? Math.min(layout.levels.length - 1, Math.ceil(Math.log2(1 / scale))) : 0;
      const image = layout.levels[level];
      const s = scale * Math.pow(2, level);
      const sx0 = Math.max(0, Math.floor(-ox / s)), sy0 = Math.max(0, Math.floor(-oy / s));
      const sx1 = Math.min(image.width, Math.ceil((width - ox) / s)), sy1 = Math.min(image.height, Math.ceil((height - oy) / s));
      ctx.imageSmoothingEnabled = false;
      if (sx1 > sx0 && sy1 > sy0) ctx.drawImage(image, sx0, sy0, sx1 - sx0, sy1 - sy0, ox + sx0 * s, oy + sy0 * s, (sx1 - sx0) * s, (sy1 - sy0) * s);
      if (scale >= 8) {
        // Close enough to see single pages: outline them.
        ctx.strokeStyle = '#ffffff';
        ctx.lineWidth = 1;
        ctx.beginPath();
        for (let c = sx0; c <= sx1; c++) { ctx.moveTo(ox + c * scale, oy + sy0 * scale); ctx.lineTo(ox + c * scale, oy + sy1 * scale); }
        for (let r = sy0; r <= sy1; r++) { ctx.moveTo(ox + sx0 * scale, oy + r * scale); ctx.lineTo(ox + sx1 * scale, oy + r * scale); }
        ctx.stroke();
      }
      canvas.setAttribute('data-drawn', String(Number(canvas.getAttribute('data-drawn') || 0) + 1));
      canvas.setAttribute('data-scale', scale.toFixed(3));
    }
    const redraw = () => { if (!pending) { pending = true; requestAnimationFrame(draw); } };
    function pageAt(p) {
      if (!layout) return null;
      const col = Math.floor((p.x - view.ox) / view.scale), row = Math.floor((p.y - view.oy) / view.scale);
      if (col < 0 || col >= layout.cols) return null;
      for (const m of layout.maps) {
        if (row >= m.row && row < m.row + m.rows) {
          const i = (row - m.row) * layout.cols + col;
          return i < m.pages ? hitOf(m, i) : null;
        }
      }
      return null;
    }
    async function show(index) {
      const note = $('pagemap-note');
      const withPages = nearestWithPages(index);
      if (withPages < 0) {
        note.textContent = data.no_page_map || 'No snapshot has a page map.';
        layout = null; draw();
        return;
      }
      const s = snapshots[withPages];
      const bytes = await decode(s.pagemap.blob);
      const hasNodes = s.pagemap.nodes_blob !== null && s.pagemap.nodes_blob !== undefined;
      $('pagemap-colour-label').hidden = !hasNodes;
      const byNode = hasNodes && colourBy.value === 'node';
      layout = build(withPages, bytes, byNode ? await decode(s.pagemap.nodes_blob) : null);
      const o = s.pagemap.objects;
      if (o) {
        const [live, blocks] = await Promise.all([decode(o.live_blob), decode(o.blocks_blob)]);
        layout.objects = { live: new DataView(live.buffer, live.byteOffset, live.byteLength), blocks, sites: o.sites, index: null };
      }
      canvas.setAttribute('data-colour', byNode ? 'node' : 'class');
      view = fit();
      const zoom = parseFloat(params.get('zoom'));
      if (zoom > 0 && isFinite(zoom)) view.scale *= zoom;
      const total = s.pagemap.maps.reduce((sum, m) => sum + m.pages, 0);
      note.textContent = (withPages === index ? '' : 'nearest snapshot with a page map: ') + 'snapshot ' + withPages + ' at ' + fmtSeconds(s.seconds) +
        ' (' + s.reason + '): ' + s.pagemap.maps.length + ' heap mapping(s), ' + fmtCount(total) + ' pages, ' + layout.cols + ' pages per row';
      canvas.setAttribute('data-pages', String(total));
      canvas.setAttribute('data-snapshot', String(withPages));
      draw();
      const address = parseInt(params.get('address') || '', 16);
      if (address > 0) {
        const hit = pageOfAddress(address);
        $('pagemap-page').textContent = hit ? describe(hit) : 'No heap page at 0x' + address.toString(16) + ' in snapshot ' + withPages + '.';
      }
    }
    function pageOfAddress(address) {
      for (const m of layout.maps) {
        const i = Math.floor((address - m.start) / m.pageSize);
        if (i >= 0 && i < m.pages) return hitOf(m, i);
      }
      return null;
    }
    function hitOf(m, i) {
      return { map: m, index: i, byte: layout.bytes[m.offset + i], node: layout.nodes ? layout.nodes[m.offset + i] : null };
    }
    // Per page, where its entry starts in the blocks stream (see html.rs).
    function readVarint(bytes, at) {
      let value = 0, scale = 1, b;
      do {
        b = bytes[at.pos++];
        value += (b & 0x7f) * scale;
        scale *= 128;
      } while (b & 0x80);
      return value;
    }
    function blocksOn(g) {
      const o = layout.objects;
      if (!o.index) {
        const pages = layout.maps.reduce((n, m) => Math.max(n, m.offset + m.pages), 0);
        o.index = new Uint32Array(pages);
        const at = { pos: 0 };
        for (let p = 0; p < pages && at.pos < o.blocks.length; p++) {
          o.index[p] = at.pos;
          readVarint(o.blocks, at);
          const listed = readVarint(o.blocks, at);
          for (let k = 0; k < 3 * listed; k++) readVarint(o.blocks, at);
        }
      }
      const at = { pos: o.index[g] };
      const count = readVarint(o.blocks, at);
      const listed = [];
      for (let n = readVarint(o.blocks, at); n > 0; n--) {
        const zigzag = readVarint(o.blocks, at);
        const delta = zigzag % 2 ? -(zigzag + 1) / 2 : zigzag / 2;
        listed.push({ delta, size: readVarint(o.blocks, at), site: readVarint(o.blocks, at) });
      }
      return { count, listed, live: o.live.getUint32(4 * g, true) };
    }
    function describe(hit) {
      const address = hit.map.start + hit.index * hit.map.pageSize;
      let text = hit.map.name + '\n0x' + address.toString(16) + '  (page ' + fmtCount(hit.index) + ' of ' + fmtCount(hit.map.pages) + ')\n' + pageClassText(hit.byte) +
        (hit.node === null ? '' : hit.node === NO_NODE ? '\nnode: unknown' : '\nNUMA node ' + hit.node);
      if (!layout.objects) return text + '\n(blocks and their call sites are listed at the snapshot of ' + fmtSeconds(data.moment.seconds) + ')';
      const b = blocksOn(hit.map.offset + hit.index);
      if (b.count === 0) return text + '\nno live block';
      text += '\nlive: ' + fmtBytes(b.live) + ' in ' + fmtCount(b.count) + (b.count === 1 ? ' block' : ' blocks');
      for (const block of b.listed) {
        text += '\n  0x' + (address + block.delta).toString(16) + '  ' + fmtBytes(block.size) + '  ' + (block.site ? layout.objects.sites[block.site - 1] : '(no stack recorded)');
      }
      if (b.count > b.listed.length) text += '\n  \u2026 and ' + fmtCount(b.count - b.listed.length) + ' more';
      return text;
    }
    canvas.addEventListener('wheel', (e) => {
      if (!layout) return;
      e.preventDefault();
      const p = mouse(canvas, e);
      const next = Math.max(view.fitScale * 0.5, Math.min(64, view.scale * Math.exp(-e.deltaY * 0.0015)));
      view.ox = p.x - (p.x - view.ox) * next / view.scale;
      view.oy = p.y - (p.y - view.oy) * next / view.scale;
      view.scale = next;
      redraw();
    }, { passive: false });
    canvas.addEventListener('mousedown', (e) => { if (layout) { drag = { x: e.clientX, y: e.clientY, ox: view.ox, oy: view.oy }; e.preventDefault(); } });
    let dragged = false;
    window.addEventListener('mouseup', (e) => { dragged = drag !== null && Math.abs(e.clientX - drag.x) + Math.abs(e.clientY - drag.y) > 3; drag = null; });
    canvas.addEventListener('mousemove', (e) => {
      if (drag && layout) {
        view.ox = drag.ox + e.clientX - drag.x;
        view.oy = drag.oy + e.clientY - drag.y;
        redraw();
        return;
      }
      const hit = pageAt(mouse(canvas, e));
      if (!hit) { hideTip(); return; }
      showTip(e, describe(hit));
    });
    canvas.addEventListener('click', (e) => {
      const hit = dragged ? null : pageAt(mouse(canvas, e));
      if (hit) $('pagemap-page').textContent = describe(hit);
    });
    canvas.addEventListener('mouseleave', hideTip);
    canvas.addEventListener('dblclick', () => { if (layout) { view = fit(); redraw(); } });
    colourBy.addEventListener('change', () => { if (layout) show(layout.snapshotIndex); });
    if (params.get('colour') === 'node') colourBy.value = 'node';
    return { show, draw: () => { if (layout) { draw(); } } };
  })();

  // ---- ledger table ------------------------------------------------------------
  function showLedger(index) {
    const s = snapshots[index];
    $('ledger-at').textContent = 'snapshot ' + index + ' at ' + fmtSeconds(s.seconds) + ' (' + s.reason + ')' + (index === data.moment.index ? ', ' + data.moment.reason : index === data.peak ? ', the RSS peak' : '');
    const body = $('ledger-table').tBodies[0];
    body.replaceChildren();
    for (const row of ROWS) {
      const tr = el('tr');
      const name = el('td', row);
      name.title = ROW_MEANING[row];
      const bar = el('div', null, 'bar');
      bar.style.width = Math.max(0, Math.min(100, s.rows[row] * 100 / Math.max(1, s.rss))) * 3 + 'px';
      bar.style.background = ROW_COLOURS[row];
      const barCell = el('td');
      barCell.append(bar);
      tr.append(name, el('td', fmtBytes(s.rows[row]), 'num'), el('td', percent(s.rows[row], s.rss), 'num'), barCell);
      body.append(tr);
      if (row === 'other' && s.memgap > 0) {
        // memgap's own memory is part of other, named apart: the verdict leaves it out.
        const own = el('tr', null, 'memgap-own');
        const label = el('td', 'of it, memgap’s own');
        label.title = 'memgap’s buffers, heap, static data and code: not the program’s, left out of the verdict and the gap';
        const ownBar = el('div', null, 'bar');
        ownBar.style.width = Math.max(0, Math.min(100, s.memgap * 100 / Math.max(1, s.rss))) * 3 + 'px';
        ownBar.style.background = PALETTE.memgap;
        const ownCell = el('td');
        ownCell.append(ownBar);
        own.append(label, el('td', fmtBytes(s.memgap), 'num'), el('td', percent(s.memgap, s.rss), 'num'), ownCell);
        body.append(own);
      }
    }
    const rssRow = el('tr');
    rssRow.append(el('th', 'VmRSS'), el('th', fmtBytes(s.rss), 'num'), el('th', 'residual ' + fmtBytes(s.residual), 'num'), el('th'));
    body.append(rssRow);
    $('ledger-extra').textContent = 'malloc_trim(0) would return ' + fmtBytes(s.trim) + '; retained where trim cannot reach: ' + fmtBytes(s.retained_not_trimmable) +
      '; not resident (released): ' + fmtBytes(s.released) + '; ' + fmtCount(s.live_blocks) + ' live blocks; allocator ' + (s.allocator || 'unknown') +
      (s.arenas ? '; ' + s.arenas + ' glibc arena(s)' : '') + '. Other: files ' + fmtBytes(s.other.file + s.other.shmem) + ', program mmaps ' + fmtBytes(s.other.program_mmap) +
      ', static data ' + fmtBytes(s.other.static_data) + ', memgap ' + fmtBytes(s.other.agent) + ', unclassified ' + fmtBytes(s.other.unclassified) + '.';
    const heaps = $('heaps-table').tBodies[0];
    heaps.replaceChildren();
    for (const h of s.heaps) {
      const tr = el('tr');
      tr.append(el('td', h.name + (h.mappings > 1 ? ' (' + h.mappings + ')' : '')));
      for (const v of [h.live, h.slack, h.fragmented, h.retained, h.trimmable, h.released]) tr.append(el('td', fmtBytes(v), 'num'));
      heaps.append(tr);
    }
    $('ledger').setAttribute('data-ready', 'true');
    $('ledger').setAttribute('data-snapshot', String(index));
    showRuby(s);
    if (window.memgapGo && $('go-panel')) window.memgapGo(s, fmtBytes);
    if (window.memgapNode && $('node-panel')) window.memgapNode(s, fmtBytes);
  }

  // ---- Ruby layer (present when memgap's Ruby sampler ran) --------------------
  function showRuby(s) {
    const r = s.ruby;
    $('ruby').hidden = !r;
    if (!r) return;
    $('ruby-at').textContent = 'Ruby ' + r.version + ', GC.stat at ' + fmtSeconds(r.sampled_at_seconds) + ' (' + r.sample_kind.replace('_', ' ') + ')';
    const body = $('ruby-table').tBodies[0];
    body.replaceChildren();
    const rows = [
      ['Ruby knows of (memsize_of_all)', r.known_bytes, null],
      ['object pages (mmap)', r.object_pages_bytes, r.object_pages],
      ['\u2003live slots', r.live_slots_bytes, r.live_slots],
      ['\u2003free slots: Ruby-page fragmentation (' + (r.free_slot_fraction * 100).toFixed(0) + ' % of slots)', r.free_slots_bytes, r.free_slots],
      ['\u2003page overhead', r.page_overhead_bytes, null],
      ['object data in malloc (in the ledger\'s live row)', r.external_bytes, null],
      ['kernel RSS', s.rss, null],
    ];
    for (const [name, bytes, n] of rows) {
      const tr = el('tr');
      tr.append(el('td', name), el('td', bytes == null ? 'unknown' : fmtBytes(bytes), 'num'), el('td', n == null ? '' : fmtCount(n), 'num'));
      body.append(tr);
    }
    $('ruby').setAttribute('data-ready', 'true');
  }

  // ---- snapshot selection ----------------------------------------------------
  const selector = $('snapshot-select');
  snapshots.forEach((s, i) => {
    const option = el('option', i + ': ' + fmtSeconds(s.seconds) + ' \u2014 ' + s.reason + ' \u2014 RSS ' + fmtBytes(s.rss) + (i === data.moment.index ? ' (' + data.moment.chosen + ')' : i === data.peak ? ' (peak)' : '') + (s.pagemap ? '' : ' (no page map)'));
    option.value = String(i);
    selector.append(option);
  });
  selector.addEventListener('change', () => select(Number(selector.value)));
  function select(index) {
    selected = index;
    selector.value = String(index);
    showLedger(index);
    timeline.draw();
    return pagemap.show(index);
  }

  // ---- blame -------------------------------------------------------------------
  // Blame sees malloc's blocks: a runtime's own heap (pymalloc's arenas, Ruby's
  // object pages, V8's spaces) can hold fragmented bytes no call site is
  // charged for, so a sum short of the row says where the rest is.
  const MALLOC_OWNERS = new Set(['glibc', 'jemalloc', 'tcmalloc', 'mimalloc', 'malloc']);
  function blameSumNote(b) {
    const moment = snapshots[data.moment.index];
    const unblamed = moment.rows.fragmented - b.fragmented_bytes;
    if (unblamed <= Math.max(4096, moment.rows.fragmented / 100)) {
      return 'their fragmentation sums to the ledger\u2019s fragmented row (' + fmtBytes(b.fragmented_bytes) + ').';
    }
    const runtimeOwners = (moment.owners || []).filter((o) => !MALLOC_OWNERS.has(o.owner) && (o.rows.fragmented || 0) > 0);
    const rest = runtimeOwners.length
      ? 'inside ' + runtimeOwners.map((o) => o.owner + '\u2019s own heap (' + fmtBytes(o.rows.fragmented) + ')').join(' and ')
      : fmtBytes(unblamed);
    return 'their fragmentation sums to malloc\u2019s part of the ledger\u2019s fragmented row (' + fmtBytes(b.fragmented_bytes) + ' of ' +
      fmtBytes(moment.rows.fragmented) + '); the rest is ' + rest + ', which blame does not split by call site.';
  }

  function showBlame() {
    const b = data.blame;
    const table = $('blame-table');
    if (!b || b.entries.length === 0) {
      $('blame-note').textContent = 'No allocation site holds live blocks at ' + fmtSeconds(data.moment.seconds) + '.';
      return;
    }
    $('blame-note').textContent = b.sites + ' allocation sites at ' + fmtSeconds(b.at_seconds) + '; ' + blameSumNote(b) + (b.has_stacks ? '' : ' The trace has no call stacks (memgap run --no-stacks).') +
      (b.entries.length < b.sites ? ' Showing the top ' + b.entries.length + ' by each column.' : '');
    let key = 'fragmentation', descending = true;
    const SHOWN = 200;
    function render() {
      const entries = b.entries.slice().sort((x, y) => {
        const a = key === 'function' ? String(x.function || '') : x[key], c = key === 'function' ? String(y.function || '') : y[key];
        const order = a < c ? -1 : a > c ? 1 : 0;
        return descending ? -order : order;
      });
      for (const th of table.tHead.rows[0].cells) {
        th.classList.toggle('sorted', th.dataset.key === key);
        th.classList.toggle('up', th.dataset.key === key && !descending);
      }
      const body = table.tBodies[0];
      body.replaceChildren();
      for (const e of entries.slice(0, SHOWN)) {
        const tr = el('tr');
        const site = el('td', null, 'site');
        site.append(el('b', e.function || '(unknown)'));
        const where = [e.file ? e.file + (e.line ? ':' + e.line : '') : '', e.module, e.stacks > 1 ? e.stacks + ' stacks' : ''].filter(Boolean).join(' \u00b7 ');
        if (where) site.append(el('small', where));
        tr.append(site, el('td', fmtBytes(e.fragmentation), 'num'), el('td', fmtBytes(e.live), 'num'), el('td', fmtCount(e.objects), 'num'),
          el('td', fmtBytes(e.leaked), 'num'), el('td', e.scatter.toFixed(1), 'num'), el('td', fmtBytes(e.allocated), 'num'));
        tr.addEventListener('click', () => {
          if (tr.nextSibling && tr.nextSibling.classList.contains('stack')) { tr.nextSibling.remove(); return; }
          const stackRow = el('tr', null, 'stack');
          const cell = el('td', e.stack.length ? e.stack.join('\n') : '(no stack recorded)');
          cell.colSpan = 7;
          stackRow.append(cell);
          tr.after(stackRow);
        });
        body.append(tr);
      }
      table.setAttribute('data-rows', String(Math.min(SHOWN, entries.length)));
      table.setAttribute('data-sorted', key);
    }
    for (const th of table.tHead.rows[0].cells) {
      th.addEventListener('click', () => {
        if (key === th.dataset.key) descending = !descending; else { key = th.dataset.key; descending = key !== 'function'; }
        render();
      });
    }
    render();
    $('blame').setAttribute('data-ready', 'true');
  }

  // ---- churn -------------------------------------------------------------------
  function showChurn() {
    const c = data.churn;
    const table = $('churn-table');
    if (!c || c.entries.length === 0) {
      $('churn-note').textContent = c && c.allocations > 0
        ? 'No allocation was freed within ' + c.temporary_ms + ' ms (' + fmtCount(c.allocations) + ' allocations in the run).'
        : 'The trace holds no allocation.';
      table.hidden = true;
    } else {
      $('churn-note').textContent = fmtCount(c.temporary_allocations) + ' of the run\u2019s ' + fmtCount(c.allocations) + ' allocations (' +
        percent(c.temporary_allocations, c.allocations) + ', ' + fmtBytes(c.temporary_bytes) + ' of ' + fmtBytes(c.allocated_bytes) +
        ') were freed within ' + c.temporary_ms + ' ms. memgap blame --by temporary lists them in the terminal.';
      const body = table.tBodies[0];
      for (const e of c.entries) {
        const tr = el('tr');
        const site = el('td', null, 'site');
        site.append(el('b', e.function || '(unknown)'));
        const where = [e.file ? e.file + (e.line ? ':' + e.line : '') : '', e.module].filter(Boolean).join(' \u00b7 ');
        if (where) site.append(el('small', where));
        tr.append(site, el('td', fmtCount(e.temporary), 'num'), el('td', fmtBytes(e.temporary_bytes), 'num'),
          el('td', percent(e.temporary, c.allocations), 'num'), el('td', fmtCount(e.allocations), 'num'), el('td', fmtBytes(e.allocated), 'num'));
        tr.addEventListener('click', () => {
          if (tr.nextSibling && tr.nextSibling.classList.contains('stack')) { tr.nextSibling.remove(); return; }
          const stackRow = el('tr', null, 'stack');
          const cell = el('td', e.stack.length ? e.stack.join('\n') : '(no stack recorded)');
          cell.colSpan = 6;
          stackRow.append(cell);
          tr.after(stackRow);
        });
        body.append(tr);
      }
    }
    table.setAttribute('data-rows', String(c ? c.entries.length : 0));
    $('churn').setAttribute('data-ready', 'true');
  }

  // ---- flame graph (icicle: the root on top) ---------------------------------------
  const flame = (function () {
    const canvas = $('flame-canvas');
    const ROW = 18;
    const f = data.flame;
    let focus = null, path = [], boxes = [];
    if (f) {
      $('flame-measure').textContent = f.measure + ' bytes by call stack at ' + fmtSeconds(data.moment.seconds) + ', callers above callees; click a frame to zoom, the top bar to zoom out';
      focus = f.root;
      path = [f.root];
    } else {
      $('flame-measure').textContent = 'no call stacks hold live blocks at ' + fmtSeconds(data.moment.seconds);
    }
    function hue(name) {
      let h = 0;
      for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
      return h;
    }
    function depthOf(node, depth) {
      if (depth > 60) return depth;
      let deepest = depth;
      for (const c of node.c) deepest = Math.max(deepest, depthOf(c, depth + 1));
      return deepest;
    }
    function draw() {
      if (!focus) return;
      const rows = path.length + depthOf(focus, 0);
      const { ctx, width } = prepare(canvas, Math.max(60, Math.min(61, rows) * ROW + 4));
      ctx.fillStyle = '#fff';
      ctx.fillRect(0, 0, width, canvas.height);
      ctx.font = '11px ui-monospace, monospace';
      ctx.textBaseline = 'middle';
      boxes = [];
      function box(node, x, w, row, ancestor) {
        const y = row * ROW;
        const h = hue(node.n);
        ctx.fillStyle = ancestor ? '#d8dbe2' : 'hsl(' + (h % 55 + 5) + ',' + (70 + h % 20) + '%,' + (58 + (h >> 8) % 12) + '%)';
        ctx.fillRect(x, y, Math.max(0.5, w - 1), ROW - 1);
        boxes.push({ x, y, w, node, ancestor });
        if (w > 24) {
          ctx.save();
          ctx.beginPath(); ctx.rect(x, y, w - 2, ROW); ctx.clip();
          ctx.fillStyle = '#1d2330';
          ctx.fillText(node.n, x + 3, y + ROW / 2);
          ctx.restore();
        }
      }
      path.slice(0, -1).forEach((node, i) => box(node, 0, width, i, true));
      function walk(node, x, w, row) {
        box(node, x, w, row, false);
        if (row > 60) return;
        let cx = x;
        for (const c of node.c) {
          const cw = w * c.v / node.v;
          if (cw >= 0.5) walk(c, cx, cw, row + 1);
          cx += cw;
        }
      }
      walk(focus, 0, width, path.length - 1);
      canvas.setAttribute('data-boxes', String(boxes.length));
    }
    function hit(e) {
      const p = mouse(canvas, e);
      return boxes.find((b) => p.x >= b.x && p.x < b.x + b.w && p.y >= b.y && p.y < b.y + ROW);
    }
    canvas.addEventListener('mousemove', (e) => {
      const b = hit(e);
      if (!b) { hideTip(); return; }
      showTip(e, b.node.n + '\n' + fmtBytes(b.node.v) + ' (' + percent(b.node.v, f.root.v) + ' of all)');
    });
    canvas.addEventListener('mouseleave', hideTip);
    canvas.addEventListener('click', (e) => {
      const b = hit(e);
      if (!b) return;
      if (b.ancestor || b.node === focus) {
        const at = path.indexOf(b.node);
        path = path.slice(0, Math.max(1, b.node === focus ? at : at + 1));
      } else {
        // Path from the focus down to the node clicked.
        const trail = [];
        (function find(node) {
          if (node === b.node) return true;
          for (const c of node.c) if (find(c)) { trail.unshift(c); return true; }
          return false;
        })(focus);
        path = path.concat(trail);
      }
      focus = path[path.length - 1];
      draw();
    });
    return { draw };
  })();

  // ---- NUMA: matrices as heat maps ------------------------------------------------
  function heatTable(table, rowLabels, columnLabels, cells, format) {
    table.replaceChildren();
    const max = Math.max(0, ...cells.flat());
    const head = el('tr');
    head.append(el('th', ''));
    for (const c of columnLabels) head.append(el('th', c, 'num'));
    table.append(head);
    cells.forEach((row, i) => {
      const tr = el('tr');
      tr.append(el('th', rowLabels[i]));
      for (const v of row) {
        const td = el('td', v ? format(v) : '\u00b7', 'num');
        const share = max > 0 ? v / max : 0;
        td.style.background = v ? 'rgba(208, 71, 63, ' + (0.08 + 0.82 * share).toFixed(3) + ')' : '';
        if (share > 0.55) td.style.color = '#fff';
        tr.append(td);
      }
      table.append(tr);
    });
  }

  function showNuma() {
    const n = data.numa;
    // One node: every page is local and each table would be one cell.
    if (!n || n.nodes.length < 2) return;
    $('numa').hidden = false;
    $('numa-link').hidden = false;
    const nodes = n.nodes.map((node) => 'node ' + node.id);
    const facts = [n.nodes.length + (n.nodes.length === 1 ? ' node' : ' nodes') + ' (topology from the ' + n.topology_source + ')'];
    if (n.local_fraction !== null) facts.push('local: ' + (n.local_fraction * 100).toFixed(1) + ' % of the live heap sits on the node of the CPU that allocated it');
    if (n.hot_node !== null) facts.push('hot node: ' + n.hot_node + ' (' + (n.hot_node_share * 100).toFixed(1) + ' % of ' + n.hot_node_basis + ')');
    if (n.numa_access_rate !== null) facts.push('NUMA access rate: ' + n.numa_access_rate.toExponential(3) + ' per second');
    $('numa-facts').textContent = facts.join('; ') + '.' + (n.placement_unavailable_reason ? ' No placement: ' + n.placement_unavailable_reason + '.' : '');
    heatTable($('numa-allocation'), n.allocation_rows, nodes, n.allocation_matrix_bytes, fmtBytes);
    heatTable($('numa-distances'), nodes, nodes, n.distances, String);
    const s = n.sampled;
    if (s) {
      $('numa-sampled-title').textContent = s.kind === 'access'
        ? 'Access locality (' + s.source + '): sampled accesses by the accessing CPU\u2019s node × the data\u2019s node'
        : 'First-touch locality (page faults, not accesses): pages first touched from node (rows) × the node they landed on';
      const distances = s.by_distance.map((d) => d.distance + '\u00d7' + fmtCount(d.events)).join(', ');
      $('numa-sampled-note').textContent = (s.kind === 'access' ? '' : 'Access sampling unavailable: ' + n.access_unavailable_reason + '. ') +
        'By distance: ' + (distances || 'none') + '; ' + fmtCount(s.samples) + ' samples, ' + fmtCount(s.lost) + ' lost.';
      heatTable($('numa-sampled'), nodes, nodes, s.matrix, fmtCount);
    } else {
      $('numa-sampled-title').textContent = 'Access locality';
      $('numa-sampled-note').textContent = 'Unavailable: ' + (n.access_unavailable_reason || 'no samples') + '.';
    }
    const body = $('numa-sites').tBodies[0];
    for (const site of n.remote_by_site) {
      const tr = el('tr');
      const cell = el('td', null, 'site');
      cell.append(el('b', site.function || '(unknown)'));
      if (site.file) cell.append(el('small', site.file + (site.line ? ':' + site.line : '')));
      tr.append(cell, el('td', fmtBytes(site.remote_bytes), 'num'), el('td', fmtBytes(site.placed_bytes), 'num'));
      body.append(tr);
    }
    $('numa-sites').hidden = n.remote_by_site.length === 0;
    showNumaGhc(n);
    $('numa').setAttribute('data-ready', 'true');
  }
  // A GHC program's collections and heap per node (the paper's per-region GC table).
  function showNumaGhc(n) {
    const byNode = n.ghc_gcs_by_node || [];
    const heap = n.ghc_heap_bytes_by_node || [];
    if (byNode.length === 0 && heap.length === 0) return;
    $('numa-ghc-title').textContent = 'GHC collections per node' + (n.ghc_capability_node_rule ? ' (capabilities tied to nodes by +RTS ' + n.ghc_capability_node_rule + ')' : '');
    const body = $('numa-ghc').tBodies[0];
    n.nodes.forEach((node, i) => {
      const gcs = byNode.find((g) => g.node === node.id);
      const caps = (n.ghc_capabilities || []).filter((c) => c.node === node.id).map((c) => c.capability).join(', ');
      const tr = el('tr');
      tr.append(el('td', 'node ' + node.id), el('td', caps || '-'),
        el('td', gcs ? gcs.gcs_by_generation.map((c, g) => 'gen ' + g + ': ' + fmtCount(c)).join(', ') : '-', 'num'),
        el('td', gcs ? gcs.copied_bytes_by_generation.map((b, g) => 'gen ' + g + ': ' + fmtBytes(b)).join(', ') : '-', 'num'),
        el('td', i < heap.length ? fmtBytes(heap[i]) : '-', 'num'));
      body.append(tr);
    });
    $('numa-ghc-title').hidden = false;
    $('numa-ghc').hidden = false;
  }
  // ---- GHC heap: the RTS's layers at each major GC, stacked under VmRSS ----------
  const ghc = (function () {
    const g = data.ghc;
    if (!g) return { draw: () => {} };
    $('ghc').hidden = false;
    $('ghc-link').hidden = false;
    const GHC_ROWS = ['live', 'heap_blocks_not_live', 'megablock_free', 'block_descriptors', 'lazy_free', 'non_heap'];
    // Each RTS layer in the colour of the ledger row it lands in.
    const GHC_COLOURS = { live: ROW_COLOURS.live, heap_blocks_not_live: ROW_COLOURS.fragmented, megablock_free: ROW_COLOURS.retained, block_descriptors: ROW_COLOURS.runtime, lazy_free: ROW_COLOURS.lazy_free, non_heap: ROW_COLOURS.other };
    $('ghc-facts').textContent = (g.version ? 'GHC ' + g.version + ', ' : '') + fmtCount(g.collections) + ' GCs (' + fmtCount(g.major_collections) + ' major), max live ' + fmtBytes(g.max_live) + ', max heap ' + fmtBytes(g.max_heap);
    withCode($('ghc-verdict'), g.verdict);
    const legend = $('ghc-legend');
    for (const row of GHC_ROWS) {
      const key = el('span', row);
      key.style.borderLeft = '12px solid ' + GHC_COLOURS[row];
      key.style.paddingLeft = '4px';
      key.style.marginRight = '12px';
      legend.append(key);
    }
    const body = $('ghc-table').tBodies[0];
    if (g.settled) {
      const rss = g.settled.rss_bytes || 0;
      for (const row of GHC_ROWS) {
        const v = g.settled.rows[row];
        const tr = el('tr');
        tr.append(el('td', row), el('td', v === null ? 'unknown' : fmtBytes(v), 'num'), el('td', v === null ? '' : percent(v, rss), 'num'));
        body.append(tr);
      }
      const last = el('tr');
      last.append(el('th', 'VmRSS after the major GC at ' + fmtSeconds(g.settled.seconds)), el('th', fmtBytes(rss), 'num'), el('th'));
      body.append(last);
    }
    const caps = g.caps.map((c) => (c.capability === null ? 'no capability' : 'cap ' + c.capability) + ': ' + c.by_generation.map((n, i) => 'gen ' + i + ' ' + n).join(', '));
    const share = g.pinned_share.length ? ' -hT: ARR_WORDS ' + (g.pinned_share[g.pinned_share.length - 1].share * 100).toFixed(0) + ' % of the heap at the last census.' : '';
    const s = g.rts_summary;
    const rtsS = s.max_residency_bytes !== undefined ? ' +RTS -s: maximum residency ' + fmtBytes(s.max_residency_bytes) + ', total memory in use ' + fmtBytes(s.total_memory_in_use_bytes) + '.' : '';
    $('ghc-extra').textContent = 'GCs per capability: ' + caps.join('; ') + '.' + share + rtsS;
    const canvas = $('ghc-canvas');
    function draw() {
      const height = 280;
      const { ctx, width } = prepare(canvas, height);
      const pts = g.points;
      if (!pts.length) return;
      const t0 = 0, t1 = Math.max(pts[pts.length - 1].seconds, 1e-9);
      const top = Math.max(1, ...pts.map((p) => Math.max(p.rss || 0, p.heap)));
      const x = (t) => 50 + (t - t0) / (t1 - t0) * (width - 60);
      const y = (v) => height - 20 - v / top * (height - 30);
      for (let i = 0; i < pts.length; i++) {
        const p = pts[i];
        const x0 = x(p.seconds), x1 = i + 1 < pts.length ? x(pts[i + 1].seconds) : x0 + 3;
        let base = 0;
        for (const row of GHC_ROWS) {
          const v = Math.max(0, p.rows[row] || 0);
          ctx.fillStyle = GHC_COLOURS[row];
          ctx.fillRect(x0, y(base + v), Math.max(1, x1 - x0), y(base) - y(base + v));
          base += v;
        }
      }
      ctx.strokeStyle = '#111';
      ctx.beginPath();
      pts.forEach((p, i) => { if (p.rss !== null) { if (i) ctx.lineTo(x(p.seconds), y(p.rss)); else ctx.moveTo(x(p.seconds), y(p.rss)); } });
      ctx.stroke();
      ctx.fillStyle = '#333';
      ctx.fillText(fmtBytes(top), 2, 12);
      ctx.fillText(fmtSeconds(t1), width - 60, height - 4);
      canvas.onmousemove = (event) => {
        const rect = canvas.getBoundingClientRect();
        const t = t0 + (event.clientX - rect.left - 50) / (width - 60) * (t1 - t0);
        let best = pts[0];
        for (const p of pts) if (Math.abs(p.seconds - t) < Math.abs(best.seconds - t)) best = p;
        showTip(event, fmtSeconds(best.seconds) + ': ' + GHC_ROWS.map((r) => r + ' ' + (best.rows[r] === null ? '?' : fmtBytes(best.rows[r]))).join(', ') + (best.rss !== null ? '; VmRSS ' + fmtBytes(best.rss) : ''));
      };
    }
    draw();
    $('ghc').setAttribute('data-ready', 'true');
    return { draw };
  })();

  showBlame();
  showChurn();
  showNuma();
  flame.draw();
  if (data.flame) $('flame').setAttribute('data-ready', 'true');
  window.addEventListener('resize', () => { timeline.draw(); pagemap.draw(); flame.draw(); ghc.draw(); });
  const ready = snapshots.length ? select(selected) : Promise.resolve();
  ready.then(() => {
    $('timeline').setAttribute('data-ready', 'true');
    if (document.getElementById('pagemap-canvas').hasAttribute('data-pages')) $('pagemap').setAttribute('data-ready', 'true');
    document.body.setAttribute('data-ready', 'true');
  });
})();
