'use strict';
// The process tree's sections: one per traced process of the run, linked to
// its parent's and children's. Strings from the traces go in as textContent.
(function () {
  const $ = (id) => document.getElementById(id);
  const processes = JSON.parse($('tree-data').textContent);
  const ROW_COLOURS = JSON.parse($('data').textContent).palette.rows;
  const ROWS = ['live', 'slack', 'fragmented', 'retained', 'lazy_free', 'runtime', 'other'];

  function fmtBytes(v) {
    if (Math.abs(v) < 1024) return Math.round(v) + ' B';
    const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let i = -1;
    do { v /= 1024; i++; } while (Math.abs(v) >= 1024 && i < units.length - 1);
    return v.toFixed(Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2) + ' ' + units[i];
  }
  const fmtSeconds = (s) => (s < 1 ? (s * 1000).toFixed(0) + ' ms' : s.toFixed(2) + ' s');
  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }
  function link(text, href) {
    const a = el('a', text);
    a.href = href;
    return a;
  }
  const anchor = (p) => '#process-' + p.pid;
  const byPid = new Map(processes.map((p) => [p.pid, p]));

  // The rows at the process's moment, as one stacked bar; memgap's own memory left out of other.
  function bar(p) {
    const box = el('span', null, 'tree-bar');
    if (!p.rows) return box;
    const whole = Math.max(1, p.rss_bytes - p.memgap_bytes);
    const tip = [];
    for (const row of ROWS) {
      const bytes = row === 'other' ? Math.max(0, p.rows.other - p.memgap_bytes) : p.rows[row];
      if (bytes <= 0) continue;
      const part = el('span');
      part.style.width = (bytes * 100 / whole) + '%';
      part.style.background = ROW_COLOURS[row];
      part.title = row + ' ' + fmtBytes(bytes);
      box.append(part);
      tip.push(row + ' ' + fmtBytes(bytes));
    }
    box.title = tip.join(', ') + ' (memgap\u2019s own ' + fmtBytes(p.memgap_bytes) + ' left out)';
    return box;
  }
  function parentCell(p) {
    return byPid.has(p.ppid) ? link(String(p.ppid), anchor(byPid.get(p.ppid))) : el('span', p.ppid ? String(p.ppid) : '');
  }

  const nav = document.querySelector('header nav');
  nav.prepend(link('processes', '#tree'), ' \u00b7 ');
  const full = processes.find((p) => p.full);
  $('tree-facts').textContent = processes.length + ' traced processes of this run, the largest gap between RSS and its live heap first' +
    (full ? '; the full report below is about pid ' + full.pid : '');
  const body = document.querySelector('#tree-table tbody');
  for (const p of processes) {
    const tr = el('tr', null, p.full ? 'full' : null);
    const pid = el('td', null, 'num');
    pid.append(link(String(p.pid), anchor(p)));
    const parent = el('td', null, 'num');
    parent.append(parentCell(p));
    const barCell = el('td');
    barCell.append(bar(p));
    tr.append(pid, parent, el('td', p.command, 'command'), el('td', fmtBytes(p.peak_rss_bytes), 'num'), el('td', fmtBytes(p.gap_bytes), 'num'), barCell);
    body.append(tr);
  }

  const sections = $('tree-sections');
  for (const p of processes) {
    const section = el('div', null, 'tree-process');
    section.id = anchor(p).slice(1);
    const title = el('h3', 'pid ' + p.pid + ' ');
    title.append(el('code', p.command));
    const facts = el('p', null, 'tree-facts');
    facts.append('parent ');
    facts.append(parentCell(p));
    const children = processes.filter((c) => c.ppid === p.pid);
    if (children.length) {
      facts.append(' · children ');
      children.forEach((c, i) => { if (i) facts.append(', '); facts.append(link(String(c.pid), anchor(c))); });
    }
    const parts = [
      'peak RSS ' + fmtBytes(p.peak_rss_bytes), 'peak live heap ' + fmtBytes(p.peak_live_bytes),
      'gap ' + fmtBytes(p.gap_bytes) + (p.seconds !== null ? ' at ' + fmtSeconds(p.seconds) : ''),
      'ran ' + fmtSeconds(p.duration_seconds),
    ];
    if (p.exit_code !== null) parts.push('exit ' + p.exit_code);
    parts.push('trace ' + p.trace);
    facts.append(' · ' + parts.join(' · ') + ' · ');
    facts.append(p.full ? link('its full report below', '#verdict') : el('code', 'memgap report ' + p.trace));
    facts.append(' · ');
    facts.append(link('all processes', '#tree'));
    const verdict = el('p', null, 'tree-verdict');
    String(p.verdict || 'The trace has no snapshot.').split('`').forEach((part, i) => verdict.append(i % 2 ? el('code', part) : part));
    section.append(title, facts, bar(p), verdict);
    sections.append(section);
  }
  $('tree').setAttribute('data-ready', 'true');
})();
