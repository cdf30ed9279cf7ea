// plugd console: the operator's page over plugd's HTTP API. Plain ES module, no dependencies;
// every element is built with textContent (never HTML from strings), every action is an API call
// the CLI could make, authenticated by the session cookie and the session's CSRF token.

const CSRF_HEADER = 'X-Plugd-CSRF';
const state = {
  session: null, // {identity, role, csrf}
  plugins: new Map(), // id -> row (GET /v1/plugins) merged with detail counters
  tools: [], // GET /v1/tools?all=true
  pending: 0,
  events: null, // EventSource
  poll: null,
  view: null, // {name, arg, refresh()}
  settingsNote: null, // {id, text, at}: the last settings save's outcome
  denyReasons: {}, // approval id -> the deny reason typed so far
  logStream: null,
};

const can = {
  govern: () => ['operator', 'admin'].includes(state.session?.role),
  invoke: () => ['agent', 'admin'].includes(state.session?.role),
};

// ---------- DOM helpers ----------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function main() {
  return document.getElementById('main');
}

function render(...nodes) {
  const m = main();
  // replaceChildren writes null as the text "null": leave absent parts out.
  m.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
}

function toast(text, kind = 'info') {
  const t = document.getElementById('toast');
  t.className = kind;
  t.textContent = text;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.textContent = ''; t.className = ''; }, 6000);
}

function button(label, onclick, opts = {}) {
  return h('button', {type: 'button', class: opts.class, 'aria-label': opts.label, onclick: async (e) => {
    const b = e.currentTarget;
    b.disabled = true;
    try { await onclick(e); } catch (err) { toast(errorText(err), 'error'); } finally { b.disabled = false; }
  }}, label);
}

function fmtAge(iso) {
  if (!iso) return '';
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/** Time left until `iso` ("12s", "4m 2s"), or "timed out". */
function fmtLeft(iso) {
  if (!iso) return '';
  const s = Math.round((Date.parse(iso) - Date.now()) / 1000);
  if (s <= 0) return 'timed out';
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function pretty(v) {
  return JSON.stringify(v, null, 2);
}

// ---------- API ----------

class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code;
    this.details = body?.error?.details;
    this.body = body;
  }
}

function errorText(err) {
  if (err instanceof ApiError) return `${err.message}${err.code ? ` (${err.code})` : ''}`;
  return String(err?.message || err);
}

/** Whether serve answers: while it does not, a banner says so, the page's
 * actions are inert, and a probe every 2 s brings it back. */
function setOnline(ok) {
  const banner = document.getElementById('offline');
  if (!banner || banner.hidden === ok) return;
  banner.hidden = ok;
  document.body.classList.toggle('offline', !ok);
  main().inert = !ok;
  if (ok) { loadAll().then(() => refreshView(null)).catch(() => {}); return; }
  const probe = setInterval(async () => {
    try {
      await fetch('/readyz', {cache: 'no-store'});
      clearInterval(probe);
      setOnline(true);
    } catch { /* still away */ }
  }, 2000);
}

async function api(method, path, body) {
  const headers = {Accept: 'application/json'};
  if (method !== 'GET' && method !== 'HEAD') {
    headers['Content-Type'] = 'application/json';
    if (state.session?.csrf) headers[CSRF_HEADER] = state.session.csrf;
  }
  let resp;
  try {
    resp = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    setOnline(false);
    throw new Error('plugd cannot be reached; the page reconnects by itself');
  }
  if (resp.status === 401 && !path.startsWith('/console/')) {
    location.assign('/console/login');
    throw new ApiError(401, {error: {message: 'logged out'}});
  }
  const text = await resp.text();
  let json = null;
  if (text) { try { json = JSON.parse(text); } catch { json = {raw: text}; } }
  if (!resp.ok) throw new ApiError(resp.status, json);
  return json;
}

function enc(id) {
  // Plugin ids and tool names may hold '/', which the API takes as is.
  return id.split('/').map(encodeURIComponent).join('/');
}

// ---------- login ----------

function loginView(message) {
  document.getElementById('top').hidden = true;
  const err = h('p', {id: 'login-error', class: 'error', role: 'alert'}, message || '');
  const input = h('input', {id: 'token', name: 'token', type: 'password', autocomplete: 'current-password', required: true, placeholder: 'plugd_…'});
  const form = h('form', {id: 'login', class: 'login', onsubmit: async (e) => {
    e.preventDefault();
    err.textContent = '';
    try {
      await api('POST', '/console/login', {token: input.value});
      location.assign('/console/#/plugins');
    } catch (x) {
      err.textContent = x.status === 401 ? `Not logged in: ${x.message}` : errorText(x);
      input.select();
    }
  }},
  h('h1', {}, 'plugd console'),
  h('p', {}, 'Log in with a plugd token (plugd token create --name NAME --role ROLE), or open the one-time link that plugd serve and plugd console print.'),
  h('label', {for: 'token'}, 'Token'),
  input,
  h('button', {type: 'submit'}, 'Log in'),
  err);
  render(form);
  input.focus();
}

async function loginWithCode(code) {
  history.replaceState(null, '', '/console/login');
  try {
    await api('POST', '/console/login', {code});
    location.assign('/console/#/plugins');
  } catch (x) {
    loginView(`That login link did not work: ${x.message}`);
  }
}

// ---------- live updates ----------

function startLive() {
  const dot = document.getElementById('live');
  if (typeof EventSource === 'undefined') return startPolling();
  const es = new EventSource('/v1/events');
  state.events = es;
  es.addEventListener('open', () => { dot.className = 'live on'; dot.title = 'live updates: connected'; stopPolling(); setOnline(true); });
  es.addEventListener('error', () => {
    dot.className = 'live off';
    dot.title = 'live updates: reconnecting';
    startPolling();
    // The stream dropped: is serve gone, or only the stream?
    fetch('/readyz', {cache: 'no-store'}).catch(() => setOnline(false));
  });
  es.addEventListener('plugin', (e) => {
    const row = safeParse(e.data);
    if (!row?.id) return;
    const old = state.plugins.get(row.id) || {};
    state.plugins.set(row.id, {...old, ...row});
    refreshView(['plugins', 'plugin']);
  });
  es.addEventListener('tools', () => { loadTools().then(() => refreshView(['tools', 'plugin', 'tool'])); });
  es.addEventListener('approvals', (e) => {
    const d = safeParse(e.data);
    if (typeof d?.pending === 'number') setPending(d.pending);
    refreshView(['approvals']);
  });
  es.addEventListener('invocation', () => refreshView(['activity']));
  es.addEventListener('lagged', () => { loadAll().then(() => refreshView(null)); });
}

function safeParse(s) { try { return JSON.parse(s); } catch { return null; } }

function startPolling() {
  if (state.poll) return;
  state.poll = setInterval(() => { loadAll().then(() => refreshView(null)).catch(() => {}); }, 3000);
}

function stopPolling() {
  if (state.poll) { clearInterval(state.poll); state.poll = null; }
}

let refreshQueued = false;
function refreshView(names) {
  if (!state.view || (names && !names.includes(state.view.name))) return;
  if (refreshQueued) return;
  refreshQueued = true;
  setTimeout(() => { refreshQueued = false; state.view?.refresh?.(); }, 150);
}

async function loadPlugins() {
  const rows = await api('GET', '/v1/plugins');
  const seen = new Set();
  for (const r of rows) {
    seen.add(r.id);
    state.plugins.set(r.id, {...(state.plugins.get(r.id) || {}), ...r});
  }
  for (const id of [...state.plugins.keys()]) if (!seen.has(id)) state.plugins.delete(id);
}

async function loadTools() {
  try {
    state.tools = await api('GET', '/v1/tools?all=true');
  } catch {
    state.tools = await api('GET', '/v1/tools');
  }
}

async function loadPending() {
  try {
    const a = await api('GET', '/v1/approvals');
    setPending((a.approvals || a).length ?? 0);
  } catch { /* a role that cannot read approvals sees no badge */ }
}

async function loadAll() {
  await Promise.all([loadPlugins(), loadTools(), loadPending()]);
}

function setPending(n) {
  state.pending = n;
  const b = document.getElementById('approvals-badge');
  b.textContent = String(n);
  b.hidden = n <= 0;
  b.title = `${n} call${n === 1 ? '' : 's'} waiting for approval`;
  b.setAttribute('aria-label', b.title);
}

// ---------- plugin state ----------

function pluginState(p) {
  // The words an operator acts on, from the row's state (plugd-runtime's
  // PluginInfo.state) and the supervisor's status.
  const s = String(p.state || '');
  switch (s) {
    case 'changed': return 'changed';
    case 'invalid': return 'invalid';
    case 'unapproved': return 'unapproved';
    case 'unconfigured': return 'needs configuration';
    case 'backoff': return 'restarting';
    case 'stopped': return 'stopped';
    case 'running': case 'starting': case 'idle': case 'failed': case 'stopping': return s;
    default:
      if (!p.approved) return 'unapproved';
      return s || 'idle';
  }
}

function stateCell(p) {
  const st = pluginState(p);
  const reason = p.error || p.status?.reason || '';
  return h('td', {class: `state st-${st.replace(/ /g, '-')}`},
    h('span', {class: 'pill', title: reason || null}, st),
    reason ? h('span', {class: 'reason'}, reason) : null);
}

function counters(p) {
  // `restarts` and `stats` come with every plugin row (GET /v1/plugins).
  const s = p.stats || {};
  return {
    restarts: p.restarts ?? 0,
    shed: s.shed_notifications ?? 0,
    dropped: (s.junk_frames ?? 0) + (s.oversized_frames ?? 0),
  };
}

// ---------- views ----------

const views = {
  plugins: pluginsView,
  plugin: pluginView,
  tools: toolsView,
  tool: toolView,
  approvals: approvalsView,
  activity: activityView,
  invocation: invocationView,
  packages: packagesView,
  config: configView,
};

function route() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [name, ...rest] = hash.split('/');
  const arg = rest.length ? decodeURIComponent(rest.join('/')) : null;
  let view = name || 'plugins';
  if (view === 'plugins' && arg) view = 'plugin';
  else if (view === 'tools' && arg) view = 'tool';
  else if (view === 'activity' && arg) view = 'invocation';
  if (!views[view]) view = 'plugins';
  for (const a of document.querySelectorAll('nav a')) {
    const active = a.dataset.nav === name || (!name && a.dataset.nav === 'plugins');
    if (active) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  if (state.logStream) { state.logStream.close(); state.logStream = null; }
  state.view = {name: view, arg, refresh: null};
  const current = state.view;
  views[view](arg, current).catch((err) => {
    if (state.view === current) render(h('p', {class: 'error', role: 'alert'}, errorText(err)));
  });
}

async function pluginsView(_arg, view) {
  const draw = () => {
    const rows = [...state.plugins.values()].sort((a, b) => a.id.localeCompare(b.id));
    const table = h('table', {id: 'plugins'},
      h('caption', {}, `${rows.length} plugin${rows.length === 1 ? '' : 's'} discovered`),
      h('thead', {}, h('tr', {},
        h('th', {scope: 'col'}, 'Plugin'), h('th', {scope: 'col'}, 'Dialect'), h('th', {scope: 'col', class: 'opt'}, 'Version'),
        h('th', {scope: 'col'}, 'State'), h('th', {scope: 'col', class: 'num'}, 'Tools'),
        h('th', {scope: 'col', class: 'num opt'}, 'Restarts'), h('th', {scope: 'col', class: 'num opt'}, 'Shed / dropped'))),
      h('tbody', {}, rows.map((p) => {
        const c = counters(p);
        return h('tr', {dataset: {plugin: p.id}},
          h('th', {scope: 'row'}, h('a', {href: `#/plugins/${p.id}`}, p.id)),
          h('td', {}, p.dialect || ''),
          h('td', {class: 'opt'}, p.version || ''),
          stateCell(p),
          h('td', {class: 'num'}, String((p.tools || []).length)),
          h('td', {class: 'num restarts opt'}, String(c.restarts)),
          h('td', {class: 'num opt'}, `${c.shed} / ${c.dropped}`));
      })));
    if (state.view === view) render(h('h1', {}, 'Plugins'), h('div', {class: 'scroll'}, table));
  };
  view.refresh = () => loadPlugins().then(draw);
  await loadPlugins();
  draw();
}

function kv(rows) {
  return h('dl', {class: 'kv'}, rows.filter(Boolean).map(([k, v, id]) => [h('dt', {}, k), h('dd', {id: id || null}, v)]));
}

async function pluginView(id, view) {
  const body = h('div', {id: 'plugin-body'});
  const logPre = h('pre', {id: 'log', tabindex: '0', 'aria-label': 'stderr log'});
  const draw = async () => {
    const [p, cfg] = await Promise.all([
      api('GET', `/v1/plugins/${enc(id)}`),
      api('GET', `/v1/plugins/${enc(id)}/config`).catch((e) => ({unavailable: e})),
    ]);
    if (state.view !== view) return;
    // A form being typed into is not redrawn under the operator's hands.
    const editing = body.querySelector('#settings')?.contains(document.activeElement);
    state.plugins.set(p.id, {...(state.plugins.get(p.id) || {}), ...p});
    const st = pluginState(p);
    const reason = p.error || p.status?.reason || '';
    const actions = h('div', {class: 'actions', role: 'group', 'aria-label': 'Plugin actions'});
    const act = (label, action) => button(label, async () => {
      await api('POST', `/v1/plugins/${enc(id)}:${action}`, {});
      toast(`${label}: done`);
      await draw();
    });
    if (can.govern()) {
      // Approving is offered below what it allows (the consent summary).
      if (p.approved) {
        if (st === 'stopped') actions.append(act('Start', 'start'));
        else actions.append(act('Stop', 'stop'));
        actions.append(act('Restart', 'restart'));
        actions.append(act('Revoke', 'revoke'));
      }
    }
    const perms = p.permissions || {};
    const sandbox = [perms.mechanism, perms.mechanism_detail].filter(Boolean).join(': ') || 'none';
    const baseline = perms.baseline ? `${perms.baseline.state}${perms.baseline.mechanism && perms.baseline.mechanism !== '-' ? ` (${perms.baseline.mechanism})` : ''}` : 'n/a';
    const consent = h('section', {id: 'consent', 'aria-labelledby': 'consent-h'},
      h('h2', {id: 'consent-h'}, p.approved ? 'What was approved' : 'What approving runs'),
      kv([
        ['Command line', h('pre', {id: 'command-line'}, (p.command || []).join(' ') || '(none)')],
        ['Working directory', h('code', {}, p.cwd || p.dir || '')],
        ['Environment', h('pre', {id: 'environment'}, Object.entries(p.env || {}).map(([k, v]) => `${k}=${v}`).join('\n') || '(empty)')],
        ['Sandbox', h('span', {id: 'sandbox'}, `${sandbox}; network ${perms.network ?? 'n/a'}; runs as ${perms.user || "plugd's user"}`)],
        ['Reads', (perms.read_only || []).join(', ') || '(none)'],
        ['Writes', (perms.writable || []).join(', ') || '(none)'],
        ['Limits', limitsText(perms.limits)],
        ['Baseline containment', h('pre', {id: 'baseline'}, baselineText(perms.baseline, baseline))],
        perms.process_tracking ? ['Process tracking', perms.process_tracking] : null,
        ['Permissions per export', h('pre', {id: 'permissions'}, permissionsText(p))],
        ['Signature', h('span', {id: 'signature'}, signatureText(p.signature))],
        ['Digest', h('code', {id: 'digest'}, p.digest || '')],
        ['Approved', p.approval ? `by ${p.approval.approved_by} at ${p.approval.approved_at}${p.approval.digest !== p.digest ? ` (digest ${String(p.approval.digest).slice(0, 19)}…, files changed since)` : ''}` : 'no'],
        ['Start', p.start || 'lazy'],
        p.warnings?.length ? ['Warnings', h('ul', {}, p.warnings.map((w) => h('li', {}, w)))] : null,
      ]));
    // What deserves a second look before approving.
    const risky = [];
    if (!perms.mechanism || perms.mechanism === 'none') risky.push("No sandbox: it runs with all the rights of plugd's user.");
    if ((perms.writable || []).includes('/')) risky.push('It may write anywhere (/ is writable).');
    if (['host', 'full', 'any'].includes(String(perms.network))) risky.push(`Network: ${perms.network}.`);
    const strong = state.tools.filter((t) => t.plugin === p.id && ['high', 'critical'].includes(t.risk)).map((t) => `${t.name} (${t.risk})`);
    if (strong.length) risky.push(`Tools that wait for an operator on each call: ${strong.join(', ')}.`);
    let approveBox = null;
    if (can.govern() && !p.approved) {
      const confirming = state.confirming === p.id;
      const confirm = h('div', {id: 'approve-confirm', role: 'group', 'aria-label': `Confirm the approval of ${p.id}`, hidden: !confirming},
        h('p', {}, `Approve ${p.id}? It will run `, h('code', {}, (p.command || []).join(' ') || '(no command)'),
          `, sandbox ${sandbox}, network ${perms.network ?? 'n/a'}, writing ${(perms.writable || []).join(', ') || 'nothing'}.`),
        risky.length ? h('ul', {class: 'risky'}, risky.map((r) => h('li', {}, r))) : null,
        h('div', {class: 'actions'},
          button('Confirm approval', async () => {
            state.confirming = null;
            await api('POST', `/v1/plugins/${enc(id)}:approve`, {});
            toast(`Approved ${p.id}`);
            await draw();
          }),
          button('Cancel', async () => { state.confirming = null; await draw(); })));
      const ask = button('Approve…', async () => { state.confirming = p.id; await draw(); }, {label: `Approve ${p.id} (asks to confirm)`});
      ask.hidden = confirming;
      approveBox = h('section', {id: 'approve', 'aria-label': 'Approve'}, ask, confirm);
    }
    const c = counters(p);
    const head = h('div', {class: 'plugin-head'},
      h('h1', {}, p.id),
      kv([
        ['State', h('span', {class: `pill st-${st.replace(/ /g, '-')}`}, st), 'plugin-state'],
        reason ? ['Reason', reason, 'plugin-reason'] : null,
        ['Dialect', p.dialect], ['Version', p.version],
        ['Restarts', String(c.restarts)], ['Shed / dropped', `${c.shed} / ${c.dropped}`],
      ]),
      actions);
    const tools = state.tools.filter((t) => t.plugin === p.id);
    const settings = editing ? body.querySelector('#settings-section') : settingsSection(id, cfg, draw);
    if (risky.length && !p.approved) consent.append(h('div', {class: 'risky', id: 'risky'}, h('strong', {}, 'Look twice: '), h('ul', {}, risky.map((r) => h('li', {}, r)))));
    body.replaceChildren(...[head, consent, approveBox, settings,
      h('section', {'aria-labelledby': 'tools-h'}, h('h2', {id: 'tools-h'}, 'Tools'), toolsTable(tools))].filter(Boolean));
  };
  view.refresh = () => draw();
  await loadTools().catch(() => {});
  render(body, h('section', {'aria-labelledby': 'log-h'}, h('h2', {id: 'log-h'}, 'stderr (live tail)'), logPre));
  await draw();
  followLog(id, logPre);
}

function permissionsText(p) {
  const lines = [];
  for (const [tool, r] of Object.entries(p.tool_risks || {})) {
    const risk = typeof r === 'object' && r ? `${r.risk} (${r.source})${r.enabled === false ? ', disabled' : ''}` : String(r);
    lines.push(`${tool}: risk ${risk}`);
  }
  for (const v of p.permissions?.vai || []) {
    if (v && typeof v === 'object' && v.export) {
      const fmt = (o) => Object.entries(o || {}).map(([k, x]) => `${k} ${x}`).join(', ');
      lines.push(`${v.export}: requested ${fmt(v.requested)}; granted ${fmt(v.granted)}`);
    } else lines.push(typeof v === 'string' ? v : JSON.stringify(v));
  }
  for (const n of p.permissions?.notes || []) lines.push(`note: ${n}`);
  return lines.join('\n') || '(no per-export permissions declared)';
}

function limitsText(limits) {
  const l = Object.entries(limits || {}).filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => `${k.replace(/_/g, ' ')} ${v}`);
  return l.join(', ') || 'none';
}

function baselineText(b, summary) {
  if (!b) return 'n/a';
  const lines = [summary];
  if (b.hidden?.length) lines.push(`hidden: ${b.hidden.join(', ')}`);
  if (b.allowed?.length) lines.push(`except: ${b.allowed.join(', ')}`);
  if (b.detail) lines.push(`note: ${b.detail}`);
  return lines.join('\n');
}

function signatureText(sig) {
  if (!sig) return 'unknown';
  const parts = [sig.status];
  if (sig.key_id) parts.push(`key ${sig.key_id}`);
  if (sig.publisher || sig.signer) parts.push(`by ${sig.publisher || sig.signer}`);
  if (sig.reason) parts.push(sig.reason);
  return parts.join(', ');
}

function followLog(id, pre) {
  const MAX = 1000;
  const add = (line) => {
    pre.append(`${line.at ? `${line.at.slice(11, 19)} ` : ''}${line.line}\n`);
    while (pre.childNodes.length > MAX) pre.firstChild.remove();
    pre.scrollTop = pre.scrollHeight;
  };
  if (typeof EventSource !== 'undefined') {
    const es = new EventSource(`/v1/plugins/${enc(id)}/logs?follow=1`);
    state.logStream = es;
    es.addEventListener('log', (e) => { const l = safeParse(e.data); if (l) add(l); });
    es.addEventListener('error', () => {
      es.close();
      api('GET', `/v1/plugins/${enc(id)}/logs`).then((d) => (d.lines || []).forEach(add)).catch(() => {});
    });
  }
}

// ----- settings form -----

function settingsSection(id, cfg, redraw) {
  const sec = h('section', {id: 'settings-section', 'aria-labelledby': 'settings-h'}, h('h2', {id: 'settings-h'}, 'Settings'));
  if (cfg.unavailable) {
    sec.append(h('p', {class: 'muted'}, `Settings cannot be read: ${errorText(cfg.unavailable)}`));
    return sec;
  }
  const fields = cfg.fields || [];
  if (!fields.length) {
    sec.append(h('p', {class: 'muted'}, 'This plugin declares no settings.'));
    return sec;
  }
  const editable = can.govern();
  // What the last save said survives the redraw that live updates cause.
  const note = state.settingsNote;
  const status = h('p', {id: 'settings-status', role: 'status'},
    note && note.id === id && Date.now() - note.at < 15000 ? note.text : '');
  const say = (text) => { status.textContent = text; state.settingsNote = {id, text, at: Date.now()}; };
  const form = h('form', {id: 'settings', novalidate: true});
  const containers = new Map();
  const groups = new Map();
  for (const f of fields) {
    const box = fieldControl(f, editable);
    containers.set(f.key, box);
    if (f.group) {
      if (!groups.has(f.group)) {
        const d = h('details', {open: true, dataset: {group: f.group}}, h('summary', {}, f.group));
        groups.set(f.group, d);
        form.append(d);
      }
      groups.get(f.group).append(box);
    } else form.append(box);
  }
  const applyShowWhen = () => {
    const values = formValues(form, fields, true);
    for (const f of fields) containers.get(f.key).hidden = !shown(f, values);
  };
  form.addEventListener('click', async (e) => {
    const key = e.target?.dataset?.unset;
    if (!key) return;
    try {
      await api('PUT', `/v1/plugins/${enc(id)}/config`, {values: {[key]: null}});
      say(`Removed the stored ${key}.`);
      await redraw();
    } catch (x) { say(`Not removed: ${x.message}`); }
  });
  form.addEventListener('input', applyShowWhen);
  form.addEventListener('change', applyShowWhen);
  applyShowWhen();
  if (editable) {
    form.append(h('div', {class: 'actions'}, h('button', {type: 'submit'}, 'Save')), status);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      for (const el of form.querySelectorAll('.field-error')) el.textContent = '';
      status.textContent = '';
      const local = localProblems(form, fields);
      if (local.length) { showProblems(form, local); say('Not saved: fix the fields marked.'); return; }
      const sub = form.querySelector('button[type=submit]');
      sub.disabled = true;
      try {
        const r = await api('PUT', `/v1/plugins/${enc(id)}/config`, {values: formValues(form, fields, false)});
        say(`Saved${r.applied ? ` (${String(r.applied).replace(/_/g, ' ')})` : ''}.`);
        document.activeElement?.blur();
        await redraw();
      } catch (x) {
        const problems = x.details?.problems || [];
        if (problems.length) showProblems(form, problems);
        say(`Not saved: ${x.message}`);
      } finally { sub.disabled = false; }
    });
  } else form.append(h('p', {class: 'muted'}, 'Your role may read the settings but not change them.'));
  sec.append(form);
  return sec;
}

function showProblems(form, problems) {
  for (const p of problems) {
    const el = form.querySelector(`.field-error[data-for="${CSS.escape(p.key)}"]`);
    if (el) el.textContent = p.message;
  }
  const first = problems[0] && form.querySelector(`[name="${CSS.escape(problems[0].key)}"]`);
  first?.focus();
}

function fieldControl(f, editable) {
  const id = `f-${f.key.replace(/[^A-Za-z0-9_-]/g, '_')}`;
  const errId = `${id}-err`;
  const common = {id, name: f.key, 'aria-describedby': `${id}-desc ${errId}`, disabled: !editable, required: f.required && f.type !== 'secret' ? true : null};
  let control;
  const value = f.value ?? (f.source === 'default' ? f.default : null);
  switch (f.type) {
    case 'boolean':
      control = h('input', {...common, type: 'checkbox'});
      control.checked = value === true;
      break;
    case 'integer':
    case 'number':
      control = h('input', {...common, type: 'number', step: f.type === 'integer' ? '1' : 'any', inputmode: f.type === 'integer' ? 'numeric' : 'decimal'});
      control.value = value === null || value === undefined ? '' : String(value);
      break;
    case 'select':
      control = h('select', common,
        f.required ? null : h('option', {value: ''}, '(not set)'),
        (f.options || []).map((o) => h('option', {value: o.value}, o.label || o.value)));
      control.value = value === null || value === undefined ? '' : String(value);
      break;
    case 'secret':
      control = h('input', {...common, type: 'password', autocomplete: 'new-password', placeholder: f.set ? 'set: type to replace' : 'not set'});
      break;
    case 'json':
      control = h('textarea', {...common, rows: 3, spellcheck: 'false'});
      control.value = value === null || value === undefined ? '' : pretty(value);
      break;
    default:
      control = h('input', {...common, type: 'text'});
      control.value = value === null || value === undefined ? '' : String(value);
  }
  return h('div', {class: `field type-${f.type}`, dataset: {field: f.key}},
    h('label', {for: id}, f.label || f.key, f.required ? h('span', {class: 'req', 'aria-label': 'required'}, ' *') : null),
    control,
    f.type === 'secret' ? h('span', {class: 'secret-row'},
      h('span', {class: 'secret-state', dataset: {for: f.key}}, f.set ? 'set' : 'unset'),
      editable && f.set ? h('button', {type: 'button', class: 'link-button', dataset: {unset: f.key}}, `Remove stored ${f.label || f.key}`) : null) : null,
    h('span', {id: `${id}-desc`, class: 'desc'}, [f.description, f.source === 'default' && f.type !== 'secret' ? '(default)' : null].filter(Boolean).join(' ')),
    h('span', {id: errId, class: 'field-error', dataset: {for: f.key}, role: 'alert'}));
}

function formValues(form, fields, forConditions) {
  // Typed values of the form; for saving, secrets left empty are omitted
  // (write-only: empty means unchanged) and empty optional fields are null.
  const out = {};
  for (const f of fields) {
    const el = form.elements.namedItem(f.key);
    if (!el) continue;
    if (f.type === 'boolean') { out[f.key] = el.checked; continue; }
    const raw = el.value;
    if (f.type === 'secret') {
      if (forConditions) out[f.key] = raw || (f.set ? '••••' : '');
      else if (raw !== '') out[f.key] = raw;
      continue;
    }
    if (raw === '') { out[f.key] = forConditions ? '' : null; continue; }
    if (f.type === 'integer' || f.type === 'number') out[f.key] = Number(raw);
    else if (f.type === 'json') out[f.key] = safeParse(raw) ?? raw;
    else out[f.key] = raw;
  }
  return out;
}

function localProblems(form, fields) {
  const problems = [];
  for (const f of fields) {
    const el = form.elements.namedItem(f.key);
    const box = el?.closest('[data-field]');
    if (!el || box?.hidden) continue;
    const raw = f.type === 'boolean' ? 'x' : el.value;
    if ((f.type === 'integer' || f.type === 'number') && raw !== '' && !Number.isFinite(Number(raw))) problems.push({key: f.key, message: 'must be a number'});
    if (f.type === 'integer' && raw !== '' && !Number.isInteger(Number(raw))) problems.push({key: f.key, message: 'must be a whole number'});
    if (f.type === 'json' && raw !== '' && safeParse(raw) === null && raw.trim() !== 'null') problems.push({key: f.key, message: 'must be JSON'});
    if (f.required && raw === '' && !(f.type === 'secret' && f.set)) problems.push({key: f.key, message: 'required'});
  }
  return problems;
}

function shown(f, values) {
  // Salmex show_when: {"field": KEY, "equals"|"value": V} or {KEY: V} or a list of them (all hold).
  const cond = f.show_when;
  if (!cond) return true;
  const list = Array.isArray(cond) ? cond : [cond];
  return list.every((c) => {
    if (c && typeof c === 'object') {
      const key = c.field ?? c.key;
      if (key !== undefined) {
        const v = values[key];
        if ('equals' in c) return looseEq(v, c.equals);
        if ('value' in c) return looseEq(v, c.value);
        if ('in' in c && Array.isArray(c.in)) return c.in.some((x) => looseEq(v, x));
        if ('not_equals' in c) return !looseEq(v, c.not_equals);
        return v !== '' && v !== false && v !== null && v !== undefined;
      }
      return Object.entries(c).every(([k, want]) => Array.isArray(want) ? want.some((x) => looseEq(values[k], x)) : looseEq(values[k], want));
    }
    return true;
  });
}

function looseEq(a, b) {
  return a === b || String(a) === String(b);
}

// ----- tools -----

function toolsTable(tools) {
  if (!tools.length) return h('p', {class: 'muted'}, 'No tools (a plugin has tools once approved and started).');
  return h('div', {class: 'scroll'}, h('table', {id: 'tools'},
    h('thead', {}, h('tr', {}, h('th', {scope: 'col'}, 'Tool'), h('th', {scope: 'col'}, 'Plugin'), h('th', {scope: 'col'}, 'Risk'), h('th', {scope: 'col'}, 'State'), h('th', {scope: 'col'}, 'Description'), h('th', {scope: 'col'}, h('span', {class: 'sr-only'}, 'Actions')))),
    h('tbody', {}, tools.map((t) => {
      const enabled = t.enabled !== false;
      const toggle = can.govern() ? button(enabled ? 'Disable' : 'Enable', async () => {
        await api('POST', `/v1/tools/${enc(t.name)}:${enabled ? 'disable' : 'enable'}`, {});
        toast(`${enabled ? 'Disabled' : 'Enabled'} ${t.name}`);
        await loadTools();
        state.view?.refresh?.();
      }, {label: `${enabled ? 'Disable' : 'Enable'} ${t.name}`}) : null;
      return h('tr', {dataset: {tool: t.name}, class: enabled ? null : 'disabled'},
        h('th', {scope: 'row'}, h('a', {href: `#/tools/${t.name}`}, t.name)),
        h('td', {}, t.plugin),
        h('td', {class: `risk risk-${t.risk}`}, `${t.risk}`, h('span', {class: 'muted'}, ` (${t.risk_source || 'default'})`)),
        h('td', {class: 'enabled'}, enabled ? 'enabled' : 'disabled'),
        h('td', {}, t.title || t.description || ''),
        h('td', {}, toggle));
    }))));
}

async function toolsView(_arg, view) {
  view.refresh = async () => {
    await loadTools();
    if (state.view === view) render(h('h1', {}, 'Tools'), toolsTable(state.tools));
  };
  await view.refresh();
}

async function toolView(name, view) {
  await loadTools();
  const t = state.tools.find((x) => x.name === name);
  if (!t) throw new Error(`no tool ${name}`);
  const schema = t.input_schema || t.parameters || t.inputSchema || {type: 'object'};
  const props = schema.properties || {};
  const required = new Set(schema.required || []);
  const result = h('pre', {id: 'try-result', tabindex: '0', 'aria-live': 'polite'});
  const error = h('p', {id: 'try-error', class: 'error', role: 'alert'});
  const progress = h('p', {id: 'try-progress', role: 'status', hidden: true});
  // Required fields first, each group in the schema's order as served.
  const fields = Object.entries(props).sort(([a], [b]) => Number(required.has(b)) - Number(required.has(a)));
  const form = h('form', {id: 'try', novalidate: true},
    fields.map(([k, s]) => argControl(k, s || {}, required.has(k))),
    can.invoke() ? h('button', {type: 'submit'}, 'Call') : h('p', {class: 'muted'}, 'Calling tools needs the agent role (or admin).'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    result.textContent = ''; error.textContent = ''; progress.textContent = ''; progress.hidden = true;
    const {args, errors} = argValues(form, props, required);
    if (showFieldErrors(form, errors)) return;
    const sub = form.querySelector('button[type=submit]');
    sub.disabled = true;
    const started = Date.now();
    progress.hidden = false;
    const tick = setInterval(() => { if (!progress.dataset.reported) progress.textContent = `Calling… ${((Date.now() - started) / 1000).toFixed(1)} s`; }, 200);
    try {
      const r = await invokeStreaming(name, args, (p) => {
        progress.dataset.reported = '1';
        const pct = p.total ? ` ${Math.round((100 * p.progress) / p.total)}%` : (p.progress !== undefined ? ` ${p.progress}` : '');
        progress.textContent = `Progress${pct}${p.message ? `: ${p.message}` : ''}`;
      });
      result.textContent = pretty(r);
      progress.textContent = `Done in ${((Date.now() - started) / 1000).toFixed(2)} s`;
    } catch (x) {
      error.textContent = errorText(x);
      progress.textContent = '';
      progress.hidden = true;
    } finally { clearInterval(tick); delete progress.dataset.reported; sub.disabled = false; }
  });
  render(
    h('h1', {}, t.name),
    kv([['Plugin', h('a', {href: `#/plugins/${t.plugin}`}, t.plugin)], ['Risk', `${t.risk} (${t.risk_source || 'default'})`], ['State', t.enabled === false ? 'disabled' : 'enabled'], ['Description', t.description || '']]),
    h('section', {'aria-labelledby': 'try-h'}, h('h2', {id: 'try-h'}, 'Try it'), form, progress, error, result),
    h('section', {'aria-labelledby': 'schema-h'}, h('h2', {id: 'schema-h'}, 'Input schema'), h('pre', {}, pretty(schema))),
    t.output_schema ? h('section', {}, h('h2', {}, 'Output schema'), h('pre', {}, pretty(t.output_schema))) : null);
}

async function invokeStreaming(name, args, onProgress) {
  // With Accept: text/event-stream the call streams `progress` events and ends with `result` or `error`.
  const resp = await fetch(`/v1/tools/${enc(name)}:invoke`, {
    method: 'POST',
    credentials: 'same-origin',
    headers: {'Content-Type': 'application/json', Accept: 'text/event-stream', [CSRF_HEADER]: state.session.csrf},
    body: JSON.stringify({args}),
  });
  const type = resp.headers.get('content-type') || '';
  if (!type.includes('text/event-stream')) {
    const text = await resp.text();
    const body = safeParse(text);
    if (!resp.ok) throw new ApiError(resp.status, body);
    return body;
  }
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += dec.decode(value, {stream: true});
    let idx;
    while ((idx = buf.indexOf('\n\n')) >= 0) {
      const chunk = buf.slice(0, idx);
      buf = buf.slice(idx + 2);
      let ev = 'message'; const data = [];
      for (const line of chunk.split('\n')) {
        if (line.startsWith('event:')) ev = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      }
      const d = safeParse(data.join('\n'));
      if (ev === 'progress') onProgress(d || {});
      else if (ev === 'result') return d;
      else if (ev === 'error') throw new ApiError(d?.status || 500, d);
    }
  }
  throw new Error('the call ended without a result');
}

function argControl(key, s, required) {
  const id = `a-${key.replace(/[^A-Za-z0-9_-]/g, '_')}`;
  const types = Array.isArray(s.type) ? s.type : [s.type];
  let control;
  if (Array.isArray(s.enum)) {
    control = h('select', {id, name: key}, required ? null : h('option', {value: ''}, '(none)'), s.enum.map((v) => h('option', {value: JSON.stringify(v)}, String(v))));
    control.dataset.kind = 'enum';
  } else if (types.includes('boolean')) {
    control = h('input', {id, name: key, type: 'checkbox'});
    control.dataset.kind = 'boolean';
    if (s.default === true) control.checked = true;
  } else if (types.includes('integer') || types.includes('number')) {
    control = h('input', {id, name: key, type: 'number', step: types.includes('integer') ? '1' : 'any', required: required || null});
    control.dataset.kind = 'number';
    if (s.default !== undefined) control.value = String(s.default);
  } else if (types.includes('object') || types.includes('array')) {
    control = h('textarea', {id, name: key, rows: 3, spellcheck: 'false', placeholder: types.includes('array') ? '[ ]' : '{ }'});
    control.dataset.kind = 'json';
    if (s.default !== undefined) control.value = JSON.stringify(s.default);
  } else {
    control = h('input', {id, name: key, type: 'text', required: required || null});
    control.dataset.kind = 'string';
    if (s.default !== undefined) control.value = String(s.default);
  }
  control.setAttribute('aria-describedby', `${id}-err`);
  if (types.includes('integer')) control.dataset.integer = '1';
  return h('div', {class: 'field'},
    h('label', {for: id}, s.title || key, required ? h('span', {class: 'req', 'aria-label': 'required'}, ' *') : null),
    control,
    h('span', {class: 'field-error', id: `${id}-err`}),
    s.description ? h('span', {class: 'desc'}, s.description) : null);
}

/** The arguments the form holds, and per field what is wrong with it
 * (checked before anything is sent). */
function argValues(form, props, required) {
  const args = {};
  const errors = {};
  for (const key of Object.keys(props)) {
    const el = form.elements.namedItem(key);
    if (!el) continue;
    const kind = el.dataset.kind;
    if (kind === 'boolean') { args[key] = el.checked; continue; }
    if (kind === 'number' && el.validity?.badInput) { errors[key] = 'not a number'; continue; }
    if (el.value === '') {
      if (required.has(key)) errors[key] = 'required';
      continue;
    }
    if (kind === 'number') {
      const n = Number(el.value);
      if (!Number.isFinite(n)) errors[key] = 'not a number';
      else if (el.dataset.integer && !Number.isInteger(n)) errors[key] = 'not a whole number';
      else args[key] = n;
    } else if (kind === 'enum') args[key] = JSON.parse(el.value);
    else if (kind === 'json') {
      try { args[key] = JSON.parse(el.value); } catch { errors[key] = 'not JSON'; }
    } else args[key] = el.value;
  }
  return {args, errors};
}

/** Writes each field's error beside it (clearing the others); focuses the
 * first wrong field. Whether there was any. */
function showFieldErrors(form, errors) {
  let first = null;
  for (const el of form.querySelectorAll('[name]')) {
    const msg = errors[el.name] || '';
    const out = form.querySelector(`#${CSS.escape(el.id)}-err`);
    if (out) out.textContent = msg;
    if (msg) { el.setAttribute('aria-invalid', 'true'); first = first || el; } else el.removeAttribute('aria-invalid');
  }
  if (first) first.focus();
  return first !== null;
}

// ----- approvals -----

async function approvalsView(_arg, view) {
  const draw = async () => {
    const data = await api('GET', '/v1/approvals');
    const list = data.approvals || data;
    setPending(list.length);
    if (state.view !== view) return;
    const table = list.length ? h('div', {class: 'scroll'}, h('table', {id: 'approvals'},
      h('thead', {}, h('tr', {}, ['Tool', 'Plugin', 'Risk', 'Arguments', 'Waiting', 'Times out in', ''].map((c) => h('th', {scope: 'col'}, c)))),
      h('tbody', {}, list.map((a) => {
        // The deny reason reaches the caller in its error; what is typed
        // outlives the table's redraws.
        const reasons = state.denyReasons;
        const reason = h('input', {type: 'text', name: 'reason', value: reasons[a.id] || null, placeholder: 'Deny reason', title: 'Sent to the caller with the denial',
          'aria-label': `Why the call of ${a.tool} is denied`, oninput: (e) => { reasons[a.id] = e.target.value; }});
        return h('tr', {dataset: {approval: a.id}},
          h('td', {class: 'tool'}, a.tool),
          h('td', {}, a.plugin),
          h('td', {class: `risk risk-${a.risk}`}, a.risk),
          h('td', {}, h('pre', {class: 'args'}, typeof a.args_preview === 'string' ? a.args_preview : pretty(a.args_preview))),
          h('td', {class: 'waiting', dataset: {since: a.requested_at}}, fmtAge(a.requested_at)),
          h('td', {class: 'left', dataset: {until: a.expires_at}}, fmtLeft(a.expires_at)),
          h('td', {}, can.govern() ? h('div', {class: 'actions'},
            button('Approve', async () => { await api('POST', `/v1/approvals/${encodeURIComponent(a.id)}:approve`, {}); toast(`Approved ${a.tool}`); await draw(); }, {label: `Approve the call of ${a.tool}`}),
            reason,
            button('Deny', async () => { await api('POST', `/v1/approvals/${encodeURIComponent(a.id)}:deny`, {reason: reason.value.trim() || 'denied in the console'}); toast(`Denied ${a.tool}`); await draw(); }, {class: 'danger', label: `Deny the call of ${a.tool}`})) : null));
      })))) :
      h('p', {id: 'approvals-empty', class: 'muted'}, 'Nothing waits for approval.');
    render(h('h1', {}, 'Approvals'), h('p', {}, 'Calls of high and critical tools wait here until an operator decides.'), table);
  };
  view.refresh = draw;
  await draw();
  const timer = setInterval(() => {
    if (state.view !== view) { clearInterval(timer); return; }
    for (const td of document.querySelectorAll('td.waiting')) td.textContent = fmtAge(td.dataset.since);
    for (const td of document.querySelectorAll('td.left')) td.textContent = fmtLeft(td.dataset.until);
  }, 1000);
}

// ----- activity -----

async function activityView(_arg, view) {
  const params = new URLSearchParams(sessionStorage.getItem('activity-filter') || '');
  const field = (name, label, type = 'text', options = null) => {
    const id = `flt-${name}`;
    const control = options ? h('select', {id, name}, h('option', {value: ''}, 'any'), options.map((o) => h('option', {value: o}, o))) : h('input', {id, name, type});
    control.value = params.get(name) || '';
    return h('div', {class: 'field inline'}, h('label', {for: id}, label), control);
  };
  const form = h('form', {id: 'activity-filter', class: 'filters'},
    field('plugin', 'Plugin'), field('tool', 'Tool'),
    field('status', 'Status', 'text', ['succeeded', 'failed', 'cancelled', 'retryable_failure']),
    field('since', 'Since', 'date'), field('until', 'Until', 'date'),
    h('button', {type: 'submit'}, 'Filter'));
  const out = h('div', {id: 'activity-out'});
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const el of form.elements) if (el.name && el.value) p.set(el.name, el.value);
    sessionStorage.setItem('activity-filter', p.toString());
    draw();
  });
  const draw = async () => {
    const p = new URLSearchParams(sessionStorage.getItem('activity-filter') || '');
    p.set('limit', '100');
    const data = await api('GET', `/v1/invocations?${p}`);
    if (state.view !== view) return;
    const rows = data.invocations || [];
    out.replaceChildren(rows.length ? h('div', {class: 'scroll'}, h('table', {id: 'invocations'},
      h('thead', {}, h('tr', {}, ['Started', 'Tool', 'Plugin', 'Status', 'Duration', 'Caller'].map((c) => h('th', {scope: 'col'}, c)))),
      h('tbody', {}, rows.map((r) => h('tr', {dataset: {invocation: r.invocation_id}},
        h('td', {}, h('a', {href: `#/activity/${r.invocation_id}`}, r.started_at.replace('T', ' ').replace(/\.\d+Z$/, 'Z'))),
        h('td', {}, r.tool), h('td', {}, r.plugin_id),
        h('td', {class: `status status-${r.status}`}, outcome(r)),
        h('td', {class: 'num'}, `${r.duration_ms} ms`), h('td', {}, r.caller || '')))))) :
      h('p', {class: 'muted'}, 'No invocation matches.'));
  };
  render(h('h1', {}, 'Activity'), form, out);
  view.refresh = draw;
  await draw();
}

/** How a record's outcome reads: a call the policy stopped before it ran
 * is not a failure of the tool. */
function outcome(r) {
  const stopped = {refused: 'denied', blocked_by_hook: 'blocked by a hook', plugin_not_approved: 'refused: not approved', invalid_arguments: 'refused: invalid arguments'};
  if (r.status === 'failed' && stopped[r.error_code]) return `${stopped[r.error_code]} (${r.error_code})`;
  return r.status + (r.error_code ? ` (${r.error_code})` : '');
}

async function invocationView(id, _view) {
  const r = await api('GET', `/v1/invocations/${encodeURIComponent(id)}`);
  const timeline = [['started', r.started_at], ['ended', r.ended_at]];
  for (const e of r.payload?.timeline || r.payload?.events || []) timeline.push([e.event || e.kind || e.name || 'event', e.at || e.time || '']);
  timeline.sort((a, b) => String(a[1]).localeCompare(String(b[1])));
  render(
    h('p', {}, h('a', {href: '#/activity'}, '← Activity')),
    h('h1', {}, `${r.tool}: ${r.status}`),
    kv([['Invocation', h('code', {}, r.invocation_id)], ['Plugin', r.plugin_id], ['Dialect', r.dialect], ['Status', outcome(r)],
      ['Duration', `${r.duration_ms} ms`], ['Caller', r.caller || ''], ['Trace id', h('code', {id: 'trace-id'}, r.trace_id || '(no trace)')],
      r.binding_id ? ['Binding', r.binding_id] : null, r.org_id ? ['Org', r.org_id] : null, r.session_id ? ['Session', r.session_id] : null]),
    h('h2', {}, 'Timeline'),
    h('ol', {id: 'timeline'}, timeline.map(([what, at]) => h('li', {}, h('code', {}, at), ` ${what}`))),
    r.payload ? [h('h2', {}, 'Record'), h('pre', {}, pretty(r.payload))] : null);
}

// ----- packages -----

async function packagesView(_arg, view) {
  const draw = async () => {
    const [market, packages, bindings] = await Promise.all([
      api('GET', '/v1/marketplace').catch((e) => ({error: e})),
      api('GET', '/v1/plugin-packages').catch((e) => ({error: e})),
      api('GET', '/v1/plugin-bindings').catch((e) => ({error: e})),
    ]);
    if (state.view !== view) return;
    const marketSec = h('section', {id: 'marketplace', 'aria-labelledby': 'mk-h'}, h('h2', {id: 'mk-h'}, 'Marketplace'));
    if (market.error) marketSec.append(h('p', {class: 'muted'}, errorText(market.error)));
    else {
      marketSec.append(h('p', {class: 'muted'}, `${market.name} (${market.mode}), from ${market.source}; index signed by ${market.signed_by || 'nobody'}${market.signed_at ? ` at ${market.signed_at}` : ''}`));
      marketSec.append(h('div', {class: 'cards'}, (market.entries || []).map((e) => marketCard(e, draw))));
    }
    const pkgRows = packages.error ? [] : (packages.packages || packages);
    const pkgSec = h('section', {'aria-labelledby': 'pk-h'}, h('h2', {id: 'pk-h'}, 'Installed packages'),
      packages.error ? h('p', {class: 'muted'}, errorText(packages.error)) : h('div', {class: 'scroll'}, h('table', {id: 'packages'},
        h('thead', {}, h('tr', {}, ['Package', 'Version', 'Exports', 'Signature', 'Digest', 'Installed'].map((c) => h('th', {scope: 'col'}, c)))),
        h('tbody', {}, pkgRows.map((p) => h('tr', {dataset: {package: p.package_id}},
          h('th', {scope: 'row'}, p.package_id), h('td', {}, p.version),
          h('td', {}, (p.exports || []).map((x) => `${x.kind || 'tool'} ${x.id || x.export_id || ''}`).join(', ')),
          h('td', {}, signatureText(p.signature)),
          h('td', {}, h('code', {title: p.digest}, String(p.digest || '').slice(0, 19))),
          h('td', {}, `${(p.installed_at || '').replace('T', ' ')} by ${p.installed_by || '?'}`)))))));
    const bRows = bindings.error ? [] : (bindings.bindings || bindings);
    const bSec = h('section', {'aria-labelledby': 'bd-h'}, h('h2', {id: 'bd-h'}, 'Bindings'),
      bindings.error ? h('p', {class: 'muted'}, errorText(bindings.error)) : h('div', {class: 'scroll'}, h('table', {id: 'bindings'},
        h('thead', {}, h('tr', {}, ['Org', 'Project', 'Export', 'Package', 'Status', 'Rollout', 'Config', 'Secrets'].map((c) => h('th', {scope: 'col'}, c)))),
        h('tbody', {}, bRows.map((b) => h('tr', {dataset: {binding: b.binding_id}},
          h('td', {}, b.org_id), h('td', {}, b.project_id || '(org-wide)'), h('td', {}, b.export_id),
          h('td', {}, `${b.package_id}@${b.package_version}`), h('td', {}, b.status), h('td', {class: 'num'}, `${b.rollout ?? 100}%`),
          h('td', {}, h('code', {}, JSON.stringify(b.config || {}))),
          h('td', {}, Object.keys(b.secrets || {}).join(', ') || '—')))))));
    render(h('h1', {}, 'Packages and bindings'), marketSec, pkgSec, bSec);
  };
  view.refresh = draw;
  await draw();
}

function marketCard(e, redraw) {
  const card = h('article', {class: 'card', dataset: {entry: e.id}},
    h('h3', {}, e.name),
    h('p', {class: 'muted'}, `${e.publisher} · ${e.id}`),
    e.description ? h('p', {}, e.description) : null,
    kv([
      ['Review', e.review],
      ['Signature', e.signature],
      ['Exports', (e.exports || []).map((x) => `${x.kind} ${x.id}`).join(', ')],
      ['Install', e.installable ? 'installable' : `${e.installability?.state || 'refused'}: ${e.installability?.reason || ''}`],
    ]));
  if (e.installable && can.govern()) {
    const org = h('input', {id: `org-${e.id}`, name: 'org_id', required: true, placeholder: 'acme'});
    const msg = h('p', {role: 'status', class: 'muted'});
    const form = h('form', {class: 'install'},
      h('label', {for: `org-${e.id}`}, 'Install for org'), org,
      h('button', {type: 'submit'}, 'Install'), msg);
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      try {
        const r = await api('POST', `/v1/marketplace/${encodeURIComponent(e.id)}:install`, {org_id: org.value});
        msg.textContent = `Installed: ${(r.bindings || []).map((b) => `${b.export_id} ${b.action}`).join(', ')}`;
        setTimeout(redraw, 1500);
      } catch (x) { msg.textContent = errorText(x); }
    });
    card.append(form);
  }
  return card;
}

// ---------- boot ----------

// ----- configuration (plugd.yaml under serve) -----

async function configView(_arg, view) {
  const draw = async () => {
    const data = await api('GET', '/v1/config');
    if (state.view !== view) return;
    const p = data.pending;
    const admin = state.session?.role === 'admin';
    const held = p ? h('section', {id: 'config-held', dataset: {digest: p.digest}},
      h('h2', {}, 'Held change'),
      kv([['Digest', p.digest], ['Seen', fmtAge(p.seen_at)]]),
      h('ul', {class: 'verdict'},
        (p.verdict.widening || []).map((w) => h('li', {class: 'widens'}, `widens: ${w}`)),
        (p.verdict.narrowing || []).map((w) => h('li', {}, `narrows: ${w}`))),
      h('pre', {class: 'diff'}, p.diff),
      admin ? h('div', {class: 'actions'}, button('Approve', async () => {
        await api('POST', '/v1/config', {approve: p.digest});
        toast('The held plugd.yaml change is in force');
        await draw();
      }, {label: 'Approve the held plugd.yaml change'})) :
        h('p', {class: 'muted'}, 'Only an administrator can approve it.')) :
      h('p', {id: 'config-nothing', class: 'muted'}, 'No change is held.');
    render(h('h1', {}, 'Configuration'),
      h('p', {}, 'plugd.yaml as serve holds it in force. A change that narrows what plugins may do is in force at once; one that widens it waits here for an administrator.'),
      kv([['In force', data.in_force, 'config-in-force'], data.error ? ['On disk', data.error, 'config-error'] : null]),
      held);
  };
  view.refresh = draw;
  await draw();
}

async function boot() {
  if (location.pathname.endsWith('/console/login')) {
    // A link opened in a tab already on this page changes only the fragment.
    const fromHash = () => {
      const code = new URLSearchParams(location.hash.replace(/^#/, '')).get('code');
      if (code) loginWithCode(code);
      return Boolean(code);
    };
    window.addEventListener('hashchange', fromHash);
    if (!fromHash()) loginView();
    return;
  }
  try {
    state.session = await api('GET', '/console/session');
  } catch {
    location.assign('/console/login');
    return;
  }
  document.getElementById('top').hidden = false;
  document.getElementById('whoami').textContent = `${state.session.identity} (${state.session.role})`;
  document.body.dataset.role = state.session.role;
  document.getElementById('logout').addEventListener('click', async () => {
    try { await api('POST', '/console/logout', {}); } finally { location.assign('/console/login'); }
  });
  await loadAll().catch((e) => toast(errorText(e), 'error'));
  window.addEventListener('hashchange', route);
  route();
  startLive();
}

boot();
