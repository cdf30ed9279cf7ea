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
  fill(main(), ...nodes);
}

/** `el`'s children become `nodes` (arrays flattened). replaceChildren
 * writes null as the text "null" and an array as its string: absent parts
 * are left out, arrays spread. */
function fill(el, ...nodes) {
  el.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
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
  ssoButtons(form);
}

/** plugd.yaml `auth.issuers` with a console client: one "Sign in with"
 * link per issuer, below the token form. */
async function ssoButtons(form) {
  let providers = [];
  try { providers = (await api('GET', '/console/sso')).providers || []; } catch { return; }
  if (!providers.length) return;
  const list = h('div', {id: 'sso', class: 'sso'}, h('p', {}, 'Or sign in with your identity provider:'));
  providers.forEach((p, i) => list.append(h('p', {}, h('a', {id: `sso-${i}`, class: 'button', href: p.start}, `Sign in with ${p.name}`))));
  form.append(list);
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
  es.addEventListener('invocation', () => refreshView(['activity', 'trends']));
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
  trends: trendsView,
  tokens: tokensView,
  audit: auditView,
  sessions: sessionsView,
};

function route() {
  // After `?`: the view's search, filters, sort and page (see listKit).
  const hash = location.hash.replace(/^#\/?/, '').split('?')[0];
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
    const risky = riskyOf(p);
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
    const offers = p.approved ? null : offersSection(p, tools);
    const withheld = withheldSection(p, draw);
    const settings = editing ? body.querySelector('#settings-section') : settingsSection(id, cfg, draw);
    if (risky.length && !p.approved) consent.append(h('div', {class: 'risky', id: 'risky'}, h('strong', {}, 'Look twice: '), h('ul', {}, risky.map((r) => h('li', {}, r)))));
    body.replaceChildren(...[head, withheld, consent, offers, approveBox, settings,
      h('section', {'aria-labelledby': 'tools-h'}, h('h2', {id: 'tools-h'}, 'Tools'), toolsTable(tools))].filter(Boolean));
  };
  view.refresh = () => draw();
  await loadTools().catch(() => {});
  render(body, h('section', {'aria-labelledby': 'log-h'}, h('h2', {id: 'log-h'}, 'stderr (live tail)'), logPre));
  await draw();
  followLog(id, logPre);
}

/** The tools of an approved plugin withheld because their definition
 * changed since approval or they are new (pinned tool definitions), each
 * with its diff; re-approving accepts them as they are now. */
function withheldSection(p, draw) {
  const ws = p.withheld_tools || [];
  if (!ws.length) return null;
  const why = (w) => (w.reason === 'new' ? 'new since approval' : 'definition changed since approval');
  let reapprove = null;
  if (can.govern()) {
    // Asking survives the page's live redraws, as the approval's does.
    const confirming = state.confirmingTools === p.id;
    const confirm = button(`Confirm: accept ${ws.length === 1 ? 'this definition' : 'these definitions'}`, async () => {
      state.confirmingTools = null;
      await api('POST', `/v1/plugins/${enc(p.id)}:approve`, {});
      toast(`Approved ${p.id} again: its tools are pinned as they are now`);
      await draw();
    });
    confirm.hidden = !confirming;
    const ask = button('Re-approve…', async () => { state.confirmingTools = p.id; await draw(); }, {label: `Re-approve ${p.id} to accept the withheld tools (asks to confirm)`});
    ask.hidden = confirming;
    reapprove = h('div', {class: 'actions', role: 'group', 'aria-label': 'Accept the withheld tools'}, ask, confirm);
  }
  return h('section', {id: 'withheld', class: 'risky', 'aria-labelledby': 'withheld-h'},
    h('h2', {id: 'withheld-h'}, 'Withheld tools'),
    h('p', {}, 'These tools are offered to no one and a call to them is refused until the plugin is approved again.'),
    h('ul', {id: 'withheld-tools'}, ws.map((w) => h('li', {},
      h('strong', {}, w.name), ` (${why(w)})`,
      h('pre', {class: 'diff', 'aria-label': `What changed in ${w.name}`}, w.diff || '')))),
    reapprove);
}

/** What an unapproved plugin will offer, from what is known before it
 * runs: the tools of its last catalog and what its manifest declares. */
function offersSection(p, tools) {
  const d = p.details || {};
  const declared = [];
  const list = (label, xs, name = (x) => (typeof x === 'string' ? x : x.name || x.id || x.export_id || JSON.stringify(x))) => {
    if (Array.isArray(xs) && xs.length) declared.push([label, xs.map(name).join(', ')]);
  };
  list('Exports', d.exports, (x) => `${x.kind || 'tool'} ${x.id || x.export_id || x.name || ''}`.trim());
  list('Tools', d.tools);
  list('Resources', d.resources);
  list('Prompts', d.prompts);
  list('Hooks', d.hooks);
  list('Channels', d.channels);
  list('Extends', d.extends);
  list('Capabilities', d.capabilities);
  if (d.mcp || d.server || p.dialect === 'mcp') declared.push(['MCP server', 'its tools, resources and prompts are listed by the server once it runs; a later change of a tool is shown here']);
  const names = tools.length ? tools.map((t) => `${t.name} (${t.risk})`) : ((p.tools || []).length ? p.tools : (p.declared_tools || []));
  return h('section', {id: 'offers', 'aria-labelledby': 'offers-h'}, h('h2', {id: 'offers-h'}, 'What it will offer'),
    kv([
      ['Tools', names.length ? h('ul', {id: 'offers-tools'}, names.map((n) => h('li', {}, n))) : h('span', {class: 'muted'}, 'none known before it runs')],
      ...declared,
    ]));
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


async function toolView(name, view) {
  await loadTools();
  const t = state.tools.find((x) => x.name === name);
  if (!t) throw new Error(`no tool ${name}`);
  const schema = t.input_schema || t.parameters || t.inputSchema || {type: 'object'};
  const props = schema.properties || {};
  const required = new Set(schema.required || []);
  const result = h('div', {id: 'try-result', tabindex: '0', 'aria-live': 'polite'});
  const error = h('p', {id: 'try-error', class: 'error', role: 'alert'});
  const progress = h('p', {id: 'try-progress', role: 'status', hidden: true});
  // Required fields first, each group in the schema's order as served.
  const fields = Object.entries(props).sort(([a], [b]) => Number(required.has(b)) - Number(required.has(a)));
  const form = h('form', {id: 'try', novalidate: true},
    fields.map(([k, s]) => argControl(k, s || {}, required.has(k))),
    can.invoke() ? h('button', {type: 'submit'}, 'Call') : h('p', {class: 'muted'}, 'Calling tools needs the agent role (or admin).'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    result.replaceChildren(); error.textContent = ''; progress.textContent = ''; progress.hidden = true;
    const {args, errors} = argValues(form, props, required);
    if (showFieldErrors(form, errors)) return;
    const sub = form.querySelector('button[type=submit]');
    sub.disabled = true;
    const started = Date.now();
    progress.hidden = false;
    const tick = setInterval(() => { if (!progress.dataset.reported) progress.textContent = `Calling… ${((Date.now() - started) / 1000).toFixed(1)} s`; }, 200);
    try {
      const meta = {};
      const r = await invokeStreaming(name, args, (p) => {
        progress.dataset.reported = '1';
        const pct = p.total ? ` ${Math.round((100 * p.progress) / p.total)}%` : (p.progress !== undefined ? ` ${p.progress}` : '');
        progress.textContent = `Progress${pct}${p.message ? `: ${p.message}` : ''}`;
      }, meta);
      result.replaceChildren(...renderResult(r));
      fill(progress, `Done in ${((Date.now() - started) / 1000).toFixed(2)} s`,
        meta.invocationId ? [' · ', h('a', {id: 'try-record', href: `#/activity/${meta.invocationId}`}, 'its record')] : []);
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

/** A tool's result as people read it: text as text, images as images,
 * structured content and anything else as JSON; the raw answer folded. */
function renderResult(r) {
  const out = [];
  const res = r?.result ?? r;
  const content = Array.isArray(res?.content) ? res.content : (Array.isArray(res) ? res : null);
  if (res?.isError || r?.is_error) out.push(h('p', {class: 'error'}, 'The tool reported an error:'));
  if (content) {
    for (const c of content) {
      if (c?.type === 'text') out.push(h('pre', {class: 'result-text'}, c.text));
      else if (c?.type === 'image' && /^image\/(png|jpeg|gif|webp)$/.test(c.mimeType || '')) {
        out.push(h('img', {class: 'result-image', alt: 'image returned by the tool', src: `data:${c.mimeType};base64,${c.data}`}));
      } else out.push(h('pre', {}, pretty(c)));
    }
  }
  const structured = res?.structuredContent ?? res?.structured_content;
  if (structured !== undefined) out.push(h('h3', {}, 'Structured content'), h('pre', {class: 'result-structured'}, pretty(structured)));
  if (!content && structured === undefined) {
    if (typeof res === 'string') out.push(h('pre', {class: 'result-text'}, res));
    else out.push(h('pre', {class: 'result-json'}, pretty(res)));
  }
  out.push(h('details', {}, h('summary', {}, 'Raw answer'), h('pre', {class: 'raw'}, pretty(r))));
  return out;
}

async function invokeStreaming(name, args, onProgress, meta = {}) {
  // With Accept: text/event-stream the call streams `progress` events and ends with `result` or `error`.
  const resp = await fetch(`/v1/tools/${enc(name)}:invoke`, {
    method: 'POST',
    credentials: 'same-origin',
    headers: {'Content-Type': 'application/json', Accept: 'text/event-stream', [CSRF_HEADER]: state.session.csrf},
    body: JSON.stringify({args}),
  });
  meta.invocationId = resp.headers.get('plugd-invocation-id') || null;
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


// ----- activity -----




// ----- packages -----


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

// ---------- lists: search, filters, sort and pages, held in the URL ----------

/** The view's parameters after `?` in the location's fragment
 * (`#/plugins?q=echo&state=running&sort=-id`), so a view can be shared. */
function hashParams() {
  const i = location.hash.indexOf('?');
  return new URLSearchParams(i >= 0 ? location.hash.slice(i + 1) : '');
}

function setHashParams(p) {
  const base = location.hash.split('?')[0] || '#/';
  const q = p.toString();
  history.replaceState(null, '', `${base}${q ? `?${q}` : ''}`);
}

/** A datetime-local value (local time) as RFC 3339 UTC, or '' when empty. */
function toRfc3339(local) {
  if (!local) return '';
  const t = new Date(local);
  return Number.isNaN(t.getTime()) ? '' : t.toISOString();
}

/** An RFC 3339 instant as a datetime-local value (local time). */
function toLocalInput(iso) {
  if (!iso) return '';
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())}T${pad(t.getHours())}:${pad(t.getMinutes())}`;
}

function fmtTime(iso) {
  return iso ? String(iso).replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '';
}

/**
 * One list screen over a paged API: a search box, filters, sortable columns
 * and cursor pages (Next, Previous, First), all kept in the URL. `spec`:
 * - `id`: the table's id; the form is `ID-filter` unless `formId` is given;
 * - `path`: the API path; `rows(answer)` picks the rows, `next(answer)` the next cursor;
 * - `query(params)`: turns the view's parameters into the API's (defaults to the same);
 * - `defaultSort`: the sort when the URL names none;
 * - `search`: the search box's label (none without it);
 * - `filters`: `[{name, label, options | type}]` (type `datetime-local` sends RFC 3339);
 * - `columns`: `[{label, sort, cls, cell(row) -> node|string, head}]`;
 * - `row(row)`: the row's attributes (dataset…); `empty`: the text when nothing matches;
 * - `select`: `{key(row), actions(selected, redraw) -> nodes}` for bulk actions.
 * Returns `{node, draw}`.
 */
function listKit(spec, view) {
  const pre0 = spec.prefix || '';
  const all0 = hashParams();
  const params = {get: (k) => all0.get(pre0 + k)};
  const formId = spec.formId || `${spec.id}-filter`;
  const controls = [];
  const field = (f) => {
    const id = `flt-${spec.id}-${f.name}`;
    let control;
    if (f.options) {
      control = h('select', {id, name: f.name}, h('option', {value: ''}, 'any'), f.options.map((o) => {
        const [value, label] = Array.isArray(o) ? o : [o, o];
        return h('option', {value}, label);
      }));
      control.value = params.get(f.name) || '';
    } else {
      control = h('input', {id, name: f.name, type: f.type || 'text', placeholder: f.placeholder || null});
      control.value = f.type === 'datetime-local' ? toLocalInput(params.get(f.name)) : (params.get(f.name) || '');
    }
    control.dataset.type = f.type || '';
    controls.push(control);
    return h('div', {class: 'field inline'}, h('label', {for: id}, f.label), control);
  };
  const search = spec.search ? h('input', {id: `${spec.id}-q`, name: 'q', type: 'search', placeholder: spec.search, 'aria-label': spec.search, autocomplete: 'off'}) : null;
  if (search) { search.value = params.get('q') || ''; controls.push(search); }
  const form = h('form', {id: formId, class: 'filters', role: 'search'},
    search ? h('div', {class: 'field inline grow'}, h('label', {for: search.id}, 'Search'), search) : null,
    (spec.filters || []).map(field),
    h('button', {type: 'submit'}, 'Filter'),
    h('button', {type: 'button', class: 'quiet', onclick: () => {
      for (const c of controls) c.value = '';
      apply();
    }}, 'Clear'));
  const out = h('div', {id: `${spec.id}-out`, class: 'list-out'});
  const status = h('p', {class: 'list-status muted', role: 'status', 'aria-live': 'polite'});
  const pager = h('nav', {class: 'pager', 'aria-label': 'Pages'});
  const node = h('div', {class: 'list'}, form, status, out, pager);
  let cursors = []; // the cursors of the pages before this one
  const selected = new Set();

  // This list's parameters, without its prefix (two lists on one screen
  // keep theirs apart: `b.q` is the bindings' search beside `q`).
  const pre = spec.prefix || '';
  const known = (k) => ['sort', 'cursor', 'limit'].includes(k) || controls.some((c) => c.name === k);
  const current = () => {
    const p = new URLSearchParams();
    for (const [k, v] of hashParams()) if (k.startsWith(pre) && known(k.slice(pre.length))) p.set(k.slice(pre.length), v);
    return p;
  };
  const keep = (p) => {
    const all = hashParams();
    for (const k of [...all.keys()]) if (k.startsWith(pre) && known(k.slice(pre.length))) all.delete(k);
    for (const [k, v] of p) all.set(pre + k, v);
    setHashParams(all);
  };
  const apply = () => {
    const p = current();
    for (const c of controls) {
      const v = c.dataset.type === 'datetime-local' ? toRfc3339(c.value) : c.value.trim();
      if (v) p.set(c.name, v); else p.delete(c.name);
    }
    p.delete('cursor');
    cursors = [];
    keep(p);
    draw();
  };
  form.addEventListener('submit', (e) => { e.preventDefault(); apply(); });
  // Typing searches by itself, a moment after the last key.
  if (search) search.addEventListener('input', () => { clearTimeout(search.timer); search.timer = setTimeout(apply, 250); });
  for (const c of controls) if (c.tagName === 'SELECT') c.addEventListener('change', apply);

  const sortButton = (col, sort) => {
    const key = col.sort;
    const on = sort === key || sort === `-${key}`;
    const desc = sort === `-${key}`;
    return h('button', {type: 'button', class: 'sort', 'aria-label': `Sort by ${col.label}${on && !desc ? ', descending' : ''}`, onclick: () => {
      const p = current();
      p.set('sort', on && !desc ? `-${key}` : key);
      p.delete('cursor');
      cursors = [];
      keep(p);
      draw();
    }}, col.label, on ? h('span', {'aria-hidden': 'true'}, desc ? ' ▼' : ' ▲') : null);
  };

  let seq = 0;
  async function draw() {
    const mine = ++seq;
    const p = current();
    const base = new URLSearchParams(p);
    if (spec.defaultSort && !base.has('sort')) base.set('sort', spec.defaultSort);
    const apiParams = spec.query ? spec.query(base) : base;
    if (!apiParams.has('limit')) apiParams.set('limit', String(spec.limit || 50));
    let answer;
    try {
      answer = await api('GET', `${spec.path}?${apiParams}`);
    } catch (err) {
      if (mine !== seq || state.view !== view) return;
      out.replaceChildren(h('p', {class: 'error', role: 'alert'}, errorText(err)));
      fill(pager,);
      return;
    }
    if (mine !== seq || state.view !== view) return;
    // Rows being ticked or typed into are not redrawn under the operator.
    if (out.contains(document.activeElement) && document.activeElement.matches('input[type=text]')) return;
    const rows = spec.rows(answer);
    const next = spec.next ? spec.next(answer) : answer.next_cursor;
    const sort = p.get('sort') || spec.defaultSort || '';
    const page = cursors.length + 1;
    const total = answer.total;
    const from = (page - 1) * Number(apiParams.get('limit')) + 1;
    status.textContent = rows.length ?
      `${total !== undefined ? `${total} match${total === 1 ? '' : 'es'}; ` : ''}showing ${from}–${from + rows.length - 1}${page > 1 ? `, page ${page}` : ''}` :
      '';
    const cols = spec.columns;
    const pick = spec.select && can.govern() ? spec.select : null;
    const allBox = pick ? h('input', {type: 'checkbox', 'aria-label': 'Select every row on this page', onchange: (e) => {
      for (const r of rows) { if (e.target.checked) selected.add(pick.key(r)); else selected.delete(pick.key(r)); }
      draw();
    }}) : null;
    if (allBox) allBox.checked = rows.length > 0 && rows.every((r) => selected.has(pick.key(r)));
    // The table stays (its headers sort and say what a row holds); an
    // empty one says so in its body.
    const span = cols.length + (pick ? 1 : 0);
    fill(out, h('div', {class: 'scroll'}, h('table', {id: spec.id},
      spec.caption ? h('caption', {}, spec.caption(answer, rows)) : null,
      h('thead', {}, h('tr', {},
        pick ? h('th', {scope: 'col', class: 'pick'}, allBox) : null,
        cols.map((c) => h('th', {scope: 'col', class: c.cls || null, 'aria-sort': c.sort && sort.replace(/^-/, '') === c.sort ? (sort.startsWith('-') ? 'descending' : 'ascending') : null},
          c.sort ? sortButton(c, sort) : (c.head || c.label))))),
      h('tbody', {}, rows.length ? rows.map((r) => h('tr', spec.row ? spec.row(r) : {},
        pick ? h('td', {class: 'pick'}, h('input', {type: 'checkbox', 'aria-label': `Select ${pick.key(r)}`, checked: selected.has(pick.key(r)), onchange: (e) => {
          if (e.target.checked) selected.add(pick.key(r)); else selected.delete(pick.key(r));
          bulkBar();
        }})) : null,
        cols.map((c) => {
          const v = c.cell(r);
          return v instanceof Node && ['TD', 'TH'].includes(v.tagName) ? v : h('td', {class: c.cls || null}, v);
        }))) :
        h('tr', {class: 'empty-row'}, h('td', {colspan: span}, h('p', {class: 'muted empty', id: spec.emptyId || null}, spec.empty || 'Nothing matches.')))))));
    bulkBar();
    const go = (cursor, stack) => {
      const q = current();
      if (cursor) q.set('cursor', cursor); else q.delete('cursor');
      cursors = stack;
      keep(q);
      draw().then(() => out.querySelector('table')?.scrollIntoView?.({block: 'nearest'}));
    };
    fill(pager,
      page > 1 ? h('button', {type: 'button', class: 'quiet', onclick: () => go(null, [])}, 'First') : null,
      page > 1 ? h('button', {type: 'button', class: 'quiet', onclick: () => { const stack = cursors.slice(0, -1); go(cursors[cursors.length - 1], stack); }}, 'Previous') : null,
      h('span', {class: 'page muted'}, `Page ${page}`),
      next ? h('button', {type: 'button', class: 'next', onclick: () => go(next, [...cursors, p.get('cursor')])}, 'Next') : null);
  }

  const bulk = h('div', {class: 'bulk', role: 'group', 'aria-label': 'Selected rows', hidden: true});
  node.insertBefore(bulk, out);
  let bulkKey = '';
  function bulkBar() {
    const key = [...selected].sort().join('\n');
    // A confirmation being read is not redrawn by a refresh.
    if (key === bulkKey) return;
    bulkKey = key;
    if (!spec.select || !can.govern() || !selected.size) { bulk.hidden = true; bulk.replaceChildren(); return; }
    bulk.hidden = false;
    fill(bulk, h('span', {class: 'count'}, `${selected.size} selected`),
      spec.select.actions([...selected], async () => { selected.clear(); await draw(); }),
      h('button', {type: 'button', class: 'quiet', onclick: () => { selected.clear(); draw(); }}, 'Clear selection'));
  }
  return {node, draw};
}

// ----- plugins -----

const PLUGIN_STATES = ['running', 'idle', 'starting', 'stopped', 'failed', 'backoff', 'unapproved', 'changed', 'invalid', 'unconfigured'];
const DIALECTS = ['native', 'mcp', 'microapp', 'salmex', 'vai', 'nexo', 'dexto', 'deno'];

/** What deserves a second look before approving `p` (a plugin's detail). */
function riskyOf(p) {
  const perms = p.permissions || {};
  const risky = [];
  if (!perms.mechanism || perms.mechanism === 'none') risky.push("No sandbox: it runs with all the rights of plugd's user.");
  if ((perms.writable || []).includes('/')) risky.push('It may write anywhere (/ is writable).');
  if (['host', 'full', 'any'].includes(String(perms.network))) risky.push(`Network: ${perms.network}.`);
  const secrets = (p.config || []).filter((c) => c.secret || c.kind === 'secret').map((c) => c.key || c.name);
  if (secrets.length) risky.push(`It is given secrets: ${secrets.join(', ')}.`);
  const strong = state.tools.filter((t) => t.plugin === p.id && ['high', 'critical'].includes(t.risk)).map((t) => `${t.name} (${t.risk})`);
  if (strong.length) risky.push(`Tools that wait for an operator on each call: ${strong.join(', ')}.`);
  return risky;
}

/** Runs `action` on each id in turn, saying how far it got; the outcome
 * names what failed. */
async function eachWithProgress(ids, verb, action, out) {
  const failed = [];
  let done = 0;
  for (const id of ids) {
    out.textContent = `${verb}: ${done} of ${ids.length} done…`;
    try { await action(id); } catch (err) { failed.push(`${id}: ${errorText(err)}`); }
    done += 1;
  }
  const ok = ids.length - failed.length;
  out.textContent = `${verb}: ${ok} of ${ids.length} done${failed.length ? `; failed: ${failed.join('; ')}` : ''}.`;
  toast(out.textContent, failed.length ? 'error' : 'info');
  return failed;
}

function pluginBulkActions(ids, redraw) {
  const msg = h('span', {class: 'bulk-outcome', role: 'status'});
  const confirmBox = h('div', {id: 'bulk-confirm', class: 'confirm', hidden: true});
  const ask = (verb, action, details) => async () => {
    confirmBox.hidden = false;
    confirmBox.replaceChildren(h('p', {}, `Loading what ${verb.toLowerCase()} means for ${ids.length} plugin${ids.length === 1 ? '' : 's'}…`));
    const items = details ? await details() : ids.map((id) => h('li', {}, id));
    fill(confirmBox,
      h('p', {}, `${verb} ${ids.length} plugin${ids.length === 1 ? '' : 's'}?`),
      h('ul', {class: 'bulk-list'}, items),
      h('div', {class: 'actions'},
        button(`Confirm: ${verb.toLowerCase()} ${ids.length}`, async () => {
          confirmBox.hidden = true;
          await eachWithProgress(ids, verb, action, msg);
          await loadPlugins().catch(() => {});
          await redraw();
        }, {class: verb === 'Revoke' ? 'danger' : null}),
        button('Cancel', async () => { confirmBox.hidden = true; })));
  };
  const post = (what) => (id) => api('POST', `/v1/plugins/${enc(id)}:${what}`, {});
  return [
    button('Approve…', ask('Approve', post('approve'), async () => {
      // The facts first: each plugin's command line and what is risky in it.
      const details = await Promise.all(ids.map((id) => api('GET', `/v1/plugins/${enc(id)}`).catch((e) => ({id, error: errorText(e)}))));
      return details.map((p) => {
        if (p.error) return h('li', {}, `${p.id}: ${p.error}`);
        const perms = p.permissions || {};
        const risky = riskyOf(p);
        return h('li', {dataset: {plugin: p.id}}, h('strong', {}, p.id), ' runs ', h('code', {}, (p.command || []).join(' ') || '(no command)'),
          `, sandbox ${[perms.mechanism, perms.mechanism_detail].filter(Boolean).join(': ') || 'none'}`,
          risky.length ? h('ul', {class: 'risky'}, risky.map((r) => h('li', {}, r))) : null);
      });
    }), {label: `Approve ${ids.length} selected plugins (asks to confirm)`}),
    button('Restart…', ask('Restart', post('restart')), {label: `Restart ${ids.length} selected plugins (asks to confirm)`}),
    button('Revoke…', ask('Revoke', post('revoke')), {class: 'danger', label: `Revoke ${ids.length} selected plugins (asks to confirm)`}),
    msg, confirmBox,
  ];
}

async function pluginsView(_arg, view) {
  const kit = listKit({
    id: 'plugins',
    path: '/v1/plugins',
    rows: (a) => {
      const rows = a.items || a;
      for (const r of rows) state.plugins.set(r.id, {...(state.plugins.get(r.id) || {}), ...r});
      return rows;
    },
    defaultSort: 'id',
    search: 'Search plugins by id, dialect, version',
    filters: [
      {name: 'state', label: 'State', options: PLUGIN_STATES},
      {name: 'dialect', label: 'Dialect', options: DIALECTS},
      {name: 'approved', label: 'Approved', options: [['true', 'yes'], ['false', 'no']]},
    ],
    caption: (a) => `${a.total ?? state.plugins.size} plugin${(a.total ?? 0) === 1 ? '' : 's'} match`,
    columns: [
      {label: 'Plugin', sort: 'id', cell: (p) => h('th', {scope: 'row'}, h('a', {href: `#/plugins/${p.id}`}, p.id))},
      {label: 'Dialect', sort: 'dialect', cell: (p) => p.dialect || ''},
      {label: 'Version', sort: 'version', cls: 'opt', cell: (p) => p.version || ''},
      {label: 'State', sort: 'state', cell: (p) => stateCell(p)},
      {label: 'Tools', cls: 'num', cell: (p) => String((p.tools || []).length)},
      {label: 'Restarts', sort: 'restarts', cls: 'num restarts opt', cell: (p) => String(counters(p).restarts)},
      {label: 'Shed / dropped', cls: 'num opt', cell: (p) => { const c = counters(p); return `${c.shed} / ${c.dropped}`; }},
    ],
    row: (p) => ({dataset: {plugin: p.id}}),
    empty: 'No plugin matches.',
    select: {key: (p) => p.id, actions: (ids, redraw) => pluginBulkActions(ids, redraw)},
  }, view);
  render(h('h1', {}, 'Plugins'), kit.node);
  view.refresh = kit.draw;
  await kit.draw();
}

// ----- tools (list) -----

function toolToggle(t) {
  const enabled = t.enabled !== false;
  return can.govern() ? button(enabled ? 'Disable' : 'Enable', async () => {
    await api('POST', `/v1/tools/${enc(t.name)}:${enabled ? 'disable' : 'enable'}`, {});
    toast(`${enabled ? 'Disabled' : 'Enabled'} ${t.name}`);
    await loadTools();
    state.view?.refresh?.();
  }, {label: `${enabled ? 'Disable' : 'Enable'} ${t.name}`}) : null;
}

const TOOL_COLUMNS = [
  {label: 'Tool', sort: 'name', cell: (t) => h('th', {scope: 'row'}, h('a', {href: `#/tools/${t.name}`}, t.name))},
  {label: 'Plugin', sort: 'plugin', cell: (t) => t.plugin},
  {label: 'Risk', sort: 'risk', cell: (t) => h('td', {class: `risk risk-${t.risk}`}, `${t.risk}`, h('span', {class: 'muted'}, ` (${t.risk_source || 'default'})`))},
  {label: 'State', cell: (t) => h('td', {class: 'enabled'}, t.enabled !== false ? 'enabled' : 'disabled')},
  {label: 'Description', cls: 'opt', cell: (t) => t.title || t.description || ''},
  {label: 'Actions', head: h('span', {class: 'sr-only'}, 'Actions'), cell: (t) => toolToggle(t)},
];

async function toolsView(_arg, view) {
  const kit = listKit({
    id: 'tools',
    path: '/v1/tools',
    rows: (a) => a.items || a,
    defaultSort: 'name',
    query: (p) => { p.set('all', 'true'); return p; },
    search: 'Search tools by name, plugin, description',
    filters: [
      {name: 'risk', label: 'Risk', options: ['low', 'medium', 'high', 'critical']},
      {name: 'enabled', label: 'State', options: [['true', 'enabled'], ['false', 'disabled']]},
      {name: 'plugin', label: 'Plugin', placeholder: 'plugin id'},
    ],
    columns: TOOL_COLUMNS,
    row: (t) => ({dataset: {tool: t.name}, class: t.enabled === false ? 'disabled' : null}),
    empty: 'No tool matches (a plugin has tools once approved and started).',
  }, view);
  render(h('h1', {}, 'Tools'), kit.node);
  view.refresh = kit.draw;
  await kit.draw();
}

// ----- approvals -----

function whoAsks(a) {
  const parts = [];
  if (a.caller) parts.push(h('span', {class: 'caller'}, a.caller));
  if (a.surface) parts.push(h('span', {class: 'muted'}, ` via ${a.surface}`));
  if (a.agent_id) parts.push(h('span', {class: 'muted'}, ` for agent ${a.agent_id}`));
  if (a.session_id) parts.push(h('span', {class: 'muted'}, ` in session ${a.session_id}`));
  return parts.length ? parts : h('span', {class: 'muted'}, 'unknown');
}

async function approvalsView(_arg, view) {
  const reasons = state.denyReasons;
  const decide = (a, verb) => async () => {
    const body = verb === 'deny' ? {reason: (reasons[a.id] || '').trim() || 'denied in the console'} : {};
    await api('POST', `/v1/approvals/${encodeURIComponent(a.id)}:${verb}`, body);
    delete reasons[a.id];
    toast(`${verb === 'deny' ? 'Denied' : 'Approved'} ${a.tool}`);
    await loadPending();
    await kit.draw();
  };
  const kit = listKit({
    id: 'approvals',
    path: '/v1/approvals',
    rows: (a) => {
      const rows = a.items || a.approvals || a;
      if (a.total !== undefined && !hashParams().toString()) setPending(a.total);
      return rows;
    },
    defaultSort: 'expires_at',
    search: 'Search by tool, plugin, arguments, caller',
    filters: [
      {name: 'risk', label: 'Risk', options: ['high', 'critical']},
      {name: 'plugin', label: 'Plugin', placeholder: 'plugin id'},
    ],
    columns: [
      {label: 'Tool', sort: 'tool', cell: (a) => h('td', {class: 'tool'}, a.tool)},
      {label: 'Plugin', sort: 'plugin', cell: (a) => a.plugin},
      {label: 'Risk', sort: 'risk', cell: (a) => h('td', {class: `risk risk-${a.risk}`}, a.risk === 'critical' ? '⚠ critical' : a.risk)},
      {label: 'Who asks', cell: (a) => h('td', {class: 'who-asks'}, whoAsks(a))},
      {label: 'Arguments', cell: (a) => h('pre', {class: 'args'}, typeof a.args_preview === 'string' ? a.args_preview : pretty(a.args_preview))},
      {label: 'Waiting', sort: 'requested_at', cell: (a) => h('td', {class: 'waiting', dataset: {since: a.requested_at}}, fmtAge(a.requested_at))},
      {label: 'Times out in', sort: 'expires_at', cell: (a) => h('td', {class: 'left', dataset: {until: a.expires_at}}, fmtLeft(a.expires_at))},
      {label: 'Decide', head: h('span', {class: 'sr-only'}, 'Decide'), cell: (a) => {
        if (!can.govern()) return '';
        // The deny reason reaches the caller in its error; what is typed
        // outlives the table's redraws.
        const reason = h('input', {type: 'text', name: 'reason', value: reasons[a.id] || null, placeholder: 'Deny reason', title: 'Sent to the caller with the denial',
          'aria-label': `Why the call of ${a.tool} is denied`, oninput: (e) => { reasons[a.id] = e.target.value; }});
        return h('div', {class: 'actions'},
          button('Approve', decide(a, 'approve'), {label: `Approve the call of ${a.tool}`}),
          reason,
          button('Deny', decide(a, 'deny'), {class: 'danger', label: `Deny the call of ${a.tool}`}));
      }},
    ],
    row: (a) => ({dataset: {approval: a.id}, class: `risk-row-${a.risk}`}),
    empty: 'Nothing waits for approval.',
    emptyId: 'approvals-empty',
  }, view);
  render(h('h1', {}, 'Approvals'), h('p', {}, 'Calls of high and critical tools wait here until an operator decides.'), kit.node);
  view.refresh = kit.draw;
  await kit.draw();
  const timer = setInterval(() => {
    if (state.view !== view) { clearInterval(timer); return; }
    for (const td of document.querySelectorAll('td.waiting')) td.textContent = fmtAge(td.dataset.since);
    for (const td of document.querySelectorAll('td.left')) td.textContent = fmtLeft(td.dataset.until);
  }, 1000);
}

// ----- activity -----

const INVOCATION_STATUSES = ['succeeded', 'failed', 'cancelled', 'retryable_failure'];

async function activityView(_arg, view) {
  const kit = listKit({
    id: 'invocations',
    formId: 'activity-filter',
    path: '/v1/invocations',
    rows: (a) => a.invocations || [],
    // Records are ordered by start only; the column's sort is the API's order.
    query: (p) => {
      const s = p.get('sort');
      p.delete('sort');
      if (s === 'started') p.set('order', 'asc');
      return p;
    },
    search: 'Search records by id, tool, plugin, caller, error',
    filters: [
      {name: 'plugin', label: 'Plugin'}, {name: 'tool', label: 'Tool'},
      {name: 'status', label: 'Status', options: INVOCATION_STATUSES},
      {name: 'org', label: 'Org'},
      {name: 'since', label: 'Since', type: 'datetime-local'}, {name: 'until', label: 'Until', type: 'datetime-local'},
    ],
    columns: [
      {label: 'Started', sort: 'started', cell: (r) => h('a', {href: `#/activity/${r.invocation_id}`}, fmtTime(r.started_at))},
      {label: 'Tool', cell: (r) => r.tool},
      {label: 'Plugin', cls: 'opt', cell: (r) => r.plugin_id},
      {label: 'Status', cell: (r) => h('td', {class: `status status-${r.status}`}, outcome(r))},
      {label: 'Duration', cls: 'num', cell: (r) => `${r.duration_ms} ms`},
      {label: 'Caller', cls: 'opt', cell: (r) => r.caller || ''},
    ],
    row: (r) => ({dataset: {invocation: r.invocation_id}}),
    empty: 'No invocation matches.',
  }, view);
  // Newest first unless the Started column says otherwise.
  render(h('h1', {}, 'Activity'), kit.node);
  view.refresh = kit.draw;
  await kit.draw();
}

/** How a record's outcome reads: a call the policy stopped before it ran
 * is not a failure of the tool. */
function outcome(r) {
  const stopped = {refused: 'denied', call_denied: 'denied', blocked_by_hook: 'blocked by a hook', plugin_not_approved: 'refused: not approved', invalid_arguments: 'refused: invalid arguments'};
  if (r.status === 'failed' && stopped[r.error_code]) return `${stopped[r.error_code]} (${r.error_code})`;
  return r.status + (r.error_code ? ` (${r.error_code})` : '');
}

function decisionText(d) {
  const parts = [d.kind];
  for (const k of ['hook', 'decision', 'effect', 'rule', 'decided_by', 'reason']) if (d[k] !== undefined && d[k] !== null) parts.push(`${k.replace(/_/g, ' ')}: ${typeof d[k] === 'string' ? d[k] : JSON.stringify(d[k])}`);
  if (d.waited_ms !== undefined) parts.push(`waited ${d.waited_ms} ms`);
  return parts.join(' · ');
}

async function invocationView(id, _view) {
  const r = await api('GET', `/v1/invocations/${encodeURIComponent(id)}`);
  const pl = r.payload || {};
  const timeline = [['started', r.started_at], ['ended', r.ended_at]];
  for (const e of pl.timeline || pl.events || []) timeline.push([e.event || e.kind || e.name || 'event', e.at || e.time || '']);
  timeline.sort((a, b) => String(a[1]).localeCompare(String(b[1])));
  const body = (v, idName, none) => (v === undefined || v === null ? h('p', {id: idName, class: 'muted'}, none) : h('pre', {id: idName}, typeof v === 'string' ? v : pretty(v)));
  const kept = 'args' in pl || 'result' in pl;
  render(
    h('p', {}, h('a', {href: '#/activity'}, '← Activity')),
    h('h1', {}, `${r.tool}: ${r.status}`),
    kv([['Invocation', h('code', {}, r.invocation_id)], ['Plugin', h('a', {href: `#/plugins/${r.plugin_id}`}, r.plugin_id)], ['Dialect', r.dialect], ['Status', outcome(r)],
      ['Duration', `${r.duration_ms} ms`], ['Caller', r.caller || ''], r.surface ? ['Surface', r.surface] : null,
      ['Trace id', [h('code', {id: 'trace-id'}, r.trace_id || '(no trace)'),
        r.trace_id && state.session?.trace_url ? [' ', h('a', {id: 'trace-link', href: state.session.trace_url.replace('{trace_id}', encodeURIComponent(r.trace_id)), target: '_blank', rel: 'noopener noreferrer'}, 'open the trace')] : null]],
      r.binding_id ? ['Binding', r.binding_id] : null, r.org_id ? ['Org', r.org_id] : null,
      r.session_id ? ['Session', h('a', {href: `#/sessions/${encodeURIComponent(r.session_id)}`}, r.session_id)] : null,
      r.run_id ? ['Run', r.run_id] : null, r.retry_count ? ['Retries', String(r.retry_count)] : null]),
    pl.error || r.error_code ? h('section', {id: 'record-error', 'aria-labelledby': 'err-h'}, h('h2', {id: 'err-h'}, 'Error'),
      kv([['Code', h('code', {}, pl.error?.code || r.error_code || '')], ['Message', h('pre', {id: 'error-message'}, pl.error?.message || '(no message kept)')]])) : null,
    h('section', {'aria-labelledby': 'dec-h'}, h('h2', {id: 'dec-h'}, 'Decisions'),
      (pl.decisions || []).length ? h('ul', {id: 'decisions'}, pl.decisions.map((d) => h('li', {}, decisionText(d)))) :
        h('p', {class: 'muted', id: 'decisions'}, 'No hook, approval or policy decision was taken on this call.')),
    h('section', {'aria-labelledby': 'args-h'}, h('h2', {id: 'args-h'}, 'Arguments'),
      body(pl.args, 'record-args', kept ? '(none)' : 'Not kept: records keep arguments and results only with records.keep_bodies on (secrets masked).')),
    h('section', {'aria-labelledby': 'res-h'}, h('h2', {id: 'res-h'}, 'Result'),
      body(pl.result, 'record-result', kept ? '(none)' : 'Not kept (records.keep_bodies is off).')),
    h('h2', {}, 'Timeline'),
    h('ol', {id: 'timeline'}, timeline.map(([what, at]) => h('li', {}, h('code', {}, at), ` ${what}`))));
}

// ----- trends (overview) -----

const WINDOWS = [['15m', 15 * 60e3, '15 minutes'], ['1h', 3600e3, 'hour'], ['24h', 24 * 3600e3, '24 hours'], ['7d', 7 * 24 * 3600e3, '7 days']];
const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

/** A bar chart of `series` (calls, errors in red) or lines (p50, p99),
 * drawn here: no script from elsewhere. */
function chart(series, kind, title) {
  const W = 600; const H = 160; const pad = 28;
  const n = Math.max(series.length, 1);
  const bw = (W - pad) / n;
  const vals = kind === 'calls' ? series.map((s) => s.calls) : series.flatMap((s) => [s.p50_ms || 0, s.p99_ms || 0]);
  const max = Math.max(1, ...vals);
  const y = (v) => H - 16 - ((H - 24) * v) / max;
  const parts = [svg('title', {}, title),
    svg('line', {x1: pad, y1: H - 16, x2: W, y2: H - 16, class: 'axis'}),
    svg('text', {x: 2, y: 12, class: 'tick'}, kind === 'calls' ? String(max) : `${max} ms`),
    svg('text', {x: 2, y: H - 18, class: 'tick'}, '0')];
  if (kind === 'calls') {
    series.forEach((s, i) => {
      const x = pad + i * bw;
      if (s.calls) parts.push(svg('rect', {x: x + 1, y: y(s.calls), width: Math.max(1, bw - 2), height: H - 16 - y(s.calls), class: 'bar'}, svg('title', {}, `${fmtTime(s.start)}: ${s.calls} calls, ${s.errors} errors`)));
      if (s.errors) parts.push(svg('rect', {x: x + 1, y: y(s.errors), width: Math.max(1, bw - 2), height: H - 16 - y(s.errors), class: 'bar err'}));
    });
  } else {
    for (const [key, cls] of [['p50_ms', 'p50'], ['p99_ms', 'p99']]) {
      const pts = series.map((s, i) => (s.calls ? [pad + i * bw + bw / 2, y(s[key] || 0), s] : null)).filter(Boolean);
      if (pts.length > 1) parts.push(svg('polyline', {points: pts.map(([x, yy]) => `${x},${yy}`).join(' '), class: `line ${cls}`}));
      // A dot per bucket with calls: one bucket alone still shows.
      for (const [x, yy, s] of pts) parts.push(svg('circle', {cx: x, cy: yy, r: 3, class: `dot ${cls}`}, svg('title', {}, `${fmtTime(s.start)}: ${cls} ${s[key]} ms`)));
    }
  }
  return svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title, class: 'chart', preserveAspectRatio: 'none'}, parts);
}

function statsTable(id, rows, key, label) {
  if (!rows.length) return h('p', {class: 'muted'}, 'No call in this window.');
  return h('div', {class: 'scroll'}, h('table', {id},
    h('thead', {}, h('tr', {}, [label, 'Calls', 'Errors', 'p50', 'p99'].map((c, i) => h('th', {scope: 'col', class: i ? 'num' : null}, c)))),
    h('tbody', {}, rows.map((r) => h('tr', {dataset: {key: r[key]}},
      h('th', {scope: 'row'}, key === 'tool' ? h('a', {href: `#/tools/${r.tool}`}, r.tool) : h('a', {href: `#/plugins/${r.plugin}`}, r.plugin)),
      h('td', {class: 'num calls'}, String(r.calls)),
      h('td', {class: `num ${r.errors ? 'status-failed' : ''}`}, String(r.errors)),
      h('td', {class: 'num'}, `${r.p50_ms} ms`), h('td', {class: 'num'}, `${r.p99_ms} ms`))))));
}

async function trendsView(_arg, view) {
  const draw = async () => {
    const p = hashParams();
    const win = WINDOWS.find((w) => w[0] === p.get('window')) || WINDOWS[1];
    const until = new Date();
    const since = new Date(until.getTime() - win[1]);
    const q = new URLSearchParams({since: since.toISOString(), until: until.toISOString(), buckets: '60'});
    if (p.get('plugin')) q.set('plugin', p.get('plugin'));
    const s = await api('GET', `/v1/invocations/stats?${q}`);
    if (state.view !== view) return;
    await loadPlugins().catch(() => {});
    const plugins = [...state.plugins.values()];
    const restarts = plugins.reduce((n, x) => n + counters(x).restarts, 0);
    const dropped = plugins.reduce((n, x) => n + counters(x).dropped + counters(x).shed, 0);
    const failing = plugins.filter((x) => ['failed', 'restarting'].includes(pluginState(x))).length;
    const series = s.series || [];
    const calls = series.reduce((n, b) => n + b.calls, 0);
    const errors = series.reduce((n, b) => n + b.errors, 0);
    const picker = h('div', {class: 'actions', role: 'group', 'aria-label': 'Window'}, WINDOWS.map(([k, , label]) =>
      h('a', {class: `button quiet${k === win[0] ? ' on' : ''}`, href: `#/trends?window=${k}`, 'aria-current': k === win[0] ? 'true' : null}, `Last ${label}`)));
    render(h('h1', {}, 'Overview'), picker,
      h('div', {class: 'tiles'},
        h('div', {class: 'tile', id: 'tile-calls'}, h('span', {class: 'n'}, String(calls)), h('span', {}, 'calls')),
        h('div', {class: `tile${errors ? ' bad' : ''}`, id: 'tile-errors'}, h('span', {class: 'n'}, String(errors)), h('span', {}, 'errors')),
        h('a', {class: `tile${state.pending ? ' warn' : ''}`, id: 'tile-approvals', href: '#/approvals'}, h('span', {class: 'n'}, String(state.pending)), h('span', {}, 'approvals waiting')),
        h('div', {class: 'tile', id: 'tile-restarts'}, h('span', {class: 'n'}, String(restarts)), h('span', {}, 'restarts')),
        h('div', {class: 'tile', id: 'tile-dropped'}, h('span', {class: 'n'}, String(dropped)), h('span', {}, 'shed or dropped')),
        h('a', {class: `tile${failing ? ' bad' : ''}`, id: 'tile-failing', href: '#/plugins?state=failed'}, h('span', {class: 'n'}, String(failing)), h('span', {}, 'plugins failing'))),
      h('section', {'aria-labelledby': 'calls-h'}, h('h2', {id: 'calls-h'}, `Calls and errors, last ${win[2]}`), chart(series, 'calls', `Calls per ${Math.round((s.bucket_ms || 60000) / 1000)} s, errors in red`)),
      h('section', {'aria-labelledby': 'lat-h'}, h('h2', {id: 'lat-h'}, 'Latency p50 and p99'), chart(series, 'latency', 'Latency p50 (solid) and p99 (dashed), in ms'),
        h('p', {class: 'legend muted'}, h('span', {class: 'key p50'}), ' p50 ', h('span', {class: 'key p99'}), ' p99')),
      h('section', {'aria-labelledby': 'bp-h'}, h('h2', {id: 'bp-h'}, 'By plugin'), statsTable('stats-plugins', s.plugins || [], 'plugin', 'Plugin')),
      h('section', {'aria-labelledby': 'bt-h'}, h('h2', {id: 'bt-h'}, 'By tool'), statsTable('stats-tools', s.tools || [], 'tool', 'Tool')),
      s.truncated ? h('p', {class: 'muted'}, `Only the newest ${s.scanned} records of the window are counted.`) : null);
  };
  // Live calls redraw it at most every 3 s.
  let last = 0;
  let queued = null;
  view.refresh = () => {
    const wait = last + 3000 - Date.now();
    if (wait > 0) {
      queued = queued || setTimeout(() => { queued = null; if (state.view === view) view.refresh(); }, wait);
      return Promise.resolve();
    }
    last = Date.now();
    return draw();
  };
  last = Date.now();
  await draw();
}

// ----- tokens (admin) -----

const ROLES = ['viewer', 'agent', 'operator', 'admin'];

async function tokensView(_arg, view) {
  const secretBox = h('div', {id: 'token-secret', role: 'status', 'aria-live': 'polite', hidden: true});
  const name = h('input', {id: 'tok-name', name: 'name', required: true, maxlength: 128, placeholder: 'ci-bot', autocomplete: 'off'});
  const role = h('select', {id: 'tok-role', name: 'role'}, ROLES.map((r) => h('option', {value: r}, r)));
  const expires = h('select', {id: 'tok-expires', name: 'expires_in'},
    [['', 'never (until revoked)'], ['1d', '1 day'], ['7d', '7 days'], ['30d', '30 days'], ['90d', '90 days'], ['365d', '1 year']].map(([v, l]) => h('option', {value: v}, l)));
  expires.value = '30d';
  const org = h('input', {id: 'tok-org', name: 'org', placeholder: '(workspace-wide)', autocomplete: 'off'});
  const formError = h('p', {id: 'token-error', class: 'error', role: 'alert'});
  const form = h('form', {id: 'token-create', class: 'filters'},
    h('div', {class: 'field inline'}, h('label', {for: 'tok-name'}, 'Name'), name),
    h('div', {class: 'field inline'}, h('label', {for: 'tok-role'}, 'Role'), role),
    h('div', {class: 'field inline'}, h('label', {for: 'tok-expires'}, 'Expires'), expires),
    h('div', {class: 'field inline'}, h('label', {for: 'tok-org'}, 'Org'), org),
    h('button', {type: 'submit'}, 'Create token'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    formError.textContent = '';
    const body = {name: name.value.trim(), role: role.value};
    if (expires.value) body.expires_in = expires.value;
    if (org.value.trim()) body.org = org.value.trim();
    if (!body.name) { formError.textContent = 'A token needs a name.'; name.focus(); return; }
    const sub = form.querySelector('button[type=submit]');
    sub.disabled = true;
    try {
      const t = await api('POST', '/v1/tokens', body);
      // Shown once: only a hash is kept.
      secretBox.hidden = false;
      secretBox.replaceChildren(
        h('p', {}, h('strong', {}, `Token ${t.name} (${t.role}) created.`), ' Copy it now: it is shown only this once.'),
        h('pre', {id: 'token-value'}, t.token),
        button('Hide', async () => { secretBox.hidden = true; secretBox.replaceChildren(); }));
      name.value = '';
      await kit.draw();
    } catch (x) { formError.textContent = errorText(x); } finally { sub.disabled = false; }
  });
  const kit = listKit({
    id: 'tokens',
    path: '/v1/tokens',
    rows: (a) => {
      const q = (hashParams().get('q') || '').toLowerCase();
      return (a.tokens || []).filter((t) => !q || `${t.name} ${t.role} ${t.id} ${t.org_id || ''}`.toLowerCase().includes(q));
    },
    next: () => null,
    query: () => new URLSearchParams(),
    search: 'Search tokens by name, role, id',
    columns: [
      {label: 'Name', cell: (t) => h('th', {scope: 'row'}, t.name)},
      {label: 'Role', cell: (t) => t.role},
      {label: 'Id', cls: 'opt', cell: (t) => h('code', {}, t.id)},
      {label: 'Scope', cls: 'opt', cell: (t) => t.org_id ? `org ${t.org_id}${(t.project_ids || []).length ? ` / ${t.project_ids.join(', ')}` : ''}` : 'workspace'},
      {label: 'Created', cls: 'opt', cell: (t) => `${fmtTime(t.created_at)}${t.created_by ? ` by ${t.created_by}` : ''}`},
      {label: 'Expires', cell: (t) => t.expires_at ? fmtTime(t.expires_at) : 'never'},
      {label: 'State', cell: (t) => h('td', {class: 'token-state'}, t.revoked_at ? `revoked ${fmtTime(t.revoked_at)}` : (t.expires_at && Date.parse(t.expires_at) < Date.now() ? 'expired' : 'live'))},
      {label: 'Revoke', head: h('span', {class: 'sr-only'}, 'Revoke'), cell: (t) => (t.revoked_at ? '' : confirmButton(`Revoke…`, `Revoke ${t.name}? Requests with it are refused from the next one.`, 'Confirm revoke', async () => {
        await api('POST', `/v1/tokens/${encodeURIComponent(t.id)}:revoke`, {});
        toast(`Revoked ${t.name}`);
        await kit.draw();
      }, `Revoke the token ${t.name}`))},
    ],
    row: (t) => ({dataset: {token: t.name}, class: t.revoked_at ? 'disabled' : null}),
    empty: 'No token yet.',
  }, view);
  render(h('h1', {}, 'Tokens'),
    h('p', {}, 'Bearer tokens for the HTTP API, /mcp and this console. Only a hash is kept: a new token is shown once.'),
    h('section', {'aria-labelledby': 'new-tok-h'}, h('h2', {id: 'new-tok-h'}, 'New token'), form, formError, secretBox),
    kit.node);
  view.refresh = kit.draw;
  await kit.draw();
}

/** A button that asks first, in place: the question, then Confirm / Cancel. */
function confirmButton(label, question, confirmLabel, action, aria) {
  const box = h('span', {class: 'confirm-inline'});
  const ask = button(label, async () => {
    box.replaceChildren(h('span', {class: 'question'}, question), ' ',
      button(confirmLabel, async () => { await action(); box.replaceChildren(ask); }, {class: 'danger'}),
      button('Cancel', async () => { box.replaceChildren(ask); }));
  }, {class: 'danger', label: aria});
  box.append(ask);
  return box;
}

// ----- audit (admin) -----

async function auditView(_arg, view) {
  const kit = listKit({
    id: 'audit',
    path: '/v1/audit',
    rows: (a) => a.entries || [],
    search: 'Search by identity, method, path',
    filters: [
      {name: 'status', label: 'Status', options: ['2xx', '4xx', '5xx']},
      {name: 'identity', label: 'Identity', placeholder: 'token:NAME'},
      {name: 'since', label: 'Since', type: 'datetime-local'}, {name: 'until', label: 'Until', type: 'datetime-local'},
    ],
    columns: [
      {label: 'At', cell: (e) => fmtTime(e.at || e.time || e.created_at)},
      {label: 'Identity', cell: (e) => e.identity},
      {label: 'Role', cls: 'opt', cell: (e) => e.role || ''},
      {label: 'Request', cell: (e) => h('code', {}, `${e.method} ${e.path}`)},
      {label: 'Status', cls: 'num', cell: (e) => h('td', {class: `num ${e.status >= 400 ? 'status-failed' : ''}`}, String(e.status))},
    ],
    row: (e) => ({dataset: {audit: String(e.id ?? '')}}),
    empty: 'No audit entry matches.',
  }, view);
  render(h('h1', {}, 'Audit trail'), h('p', {}, 'Every request that changed something, and every refused one, with who made it.'), kit.node);
  view.refresh = kit.draw;
  await kit.draw();
}

// ----- sessions, runs and chains -----

async function sessionsView(arg, view) {
  if (arg) return sessionView(arg, view);
  const [sessions, runs] = await Promise.all([
    api('GET', '/v1/sessions?limit=200').catch((e) => ({error: e})),
    api('GET', '/v1/runs?limit=200').catch((e) => ({error: e})),
  ]);
  const sRows = sessions.sessions || [];
  const rRows = runs.runs || [];
  render(h('h1', {}, 'Sessions and runs'),
    h('section', {'aria-labelledby': 'ss-h'}, h('h2', {id: 'ss-h'}, 'Sessions'),
      sessions.error ? h('p', {class: 'muted'}, errorText(sessions.error)) : sRows.length ? h('div', {class: 'scroll'}, h('table', {id: 'sessions'},
        h('thead', {}, h('tr', {}, ['Session', 'Org', 'Project', 'Head chain', 'Created'].map((c) => h('th', {scope: 'col'}, c)))),
        h('tbody', {}, sRows.map((s) => h('tr', {dataset: {session: s.id}},
          h('th', {scope: 'row'}, h('a', {href: `#/sessions/${encodeURIComponent(s.id)}`}, s.id)),
          h('td', {}, s.org_id || ''), h('td', {}, s.project_id || ''), h('td', {}, h('code', {}, s.head_chain_id || '')), h('td', {}, fmtTime(s.created_at))))))) :
        h('p', {class: 'muted'}, 'No session yet.')),
    h('section', {'aria-labelledby': 'rr-h'}, h('h2', {id: 'rr-h'}, 'Runs'),
      runs.error ? h('p', {class: 'muted'}, errorText(runs.error)) : rRows.length ? h('div', {class: 'scroll'}, h('table', {id: 'runs'},
        h('thead', {}, h('tr', {}, ['Run', 'Session', 'State', 'Started'].map((c) => h('th', {scope: 'col'}, c)))),
        h('tbody', {}, rRows.map((r) => h('tr', {dataset: {run: r.id || r.run_id}},
          h('th', {scope: 'row'}, h('code', {}, r.id || r.run_id)),
          h('td', {}, h('a', {href: `#/sessions/${encodeURIComponent(r.session_id)}`}, r.session_id)),
          h('td', {}, r.state || r.status || ''), h('td', {}, fmtTime(r.created_at || r.started_at))))))) :
        h('p', {class: 'muted'}, 'No run yet.')));
  view.refresh = null;
}

async function sessionView(id, _view) {
  const s = await api('GET', `/v1/sessions/${encodeURIComponent(id)}`);
  const transcript = s.transcript || s.messages || [];
  render(h('p', {}, h('a', {href: '#/sessions'}, '← Sessions')),
    h('h1', {}, `Session ${id}`),
    kv([['Org', s.session?.org_id || s.org_id || ''], ['Head chain', h('code', {}, s.session?.head_chain_id || s.head_chain_id || '')],
      ['Chains', String((s.chains || []).length)]]),
    h('section', {'aria-labelledby': 'tr-h'}, h('h2', {id: 'tr-h'}, 'Transcript'),
      transcript.length ? h('ol', {id: 'transcript'}, transcript.map((m) => h('li', {class: `msg role-${m.role || m.kind || 'entry'}`},
        h('strong', {}, m.role || m.kind || 'entry'), ' ', h('span', {}, typeof m.content === 'string' ? m.content : pretty(m.content ?? m))))) :
        h('p', {class: 'muted'}, 'Nothing in it yet.')),
    h('section', {'aria-labelledby': 'ch-h'}, h('h2', {id: 'ch-h'}, 'Chains'),
      h('pre', {id: 'chains'}, pretty(s.chains || []))));
}

// ----- packages and bindings -----

async function packagesView(_arg, view) {
  const marketSec = h('section', {id: 'marketplace', 'aria-labelledby': 'mk-h'}, h('h2', {id: 'mk-h'}, 'Marketplace'));
  const drawMarket = async () => {
    const market = await api('GET', '/v1/marketplace').catch((e) => ({error: e}));
    if (state.view !== view) return;
    marketSec.replaceChildren(h('h2', {id: 'mk-h'}, 'Marketplace'));
    if (market.error) marketSec.append(h('p', {class: 'muted'}, errorText(market.error)));
    else {
      marketSec.append(h('p', {class: 'muted'}, `${market.name} (${market.mode}), from ${market.source}; index signed by ${market.signed_by || 'nobody'}${market.signed_at ? ` at ${market.signed_at}` : ''}`));
      marketSec.append(h('div', {class: 'cards'}, (market.entries || []).map((e) => marketCard(e, () => view.refresh()))));
    }
  };
  const packages = listKit({
    id: 'packages',
    path: '/v1/plugin-packages',
    rows: (a) => a.items || a.packages || a,
    search: 'Search packages by id, version',
    columns: [
      {label: 'Package', sort: 'package_id', cell: (p) => h('th', {scope: 'row'}, p.package_id)},
      {label: 'Version', sort: 'version', cell: (p) => p.version},
      {label: 'Exports', cell: (p) => (p.exports || []).map((x) => `${x.kind || 'tool'} ${x.id || x.export_id || ''}`).join(', ')},
      {label: 'Signature', cls: 'opt', cell: (p) => signatureText(p.signature)},
      {label: 'Digest', cls: 'opt', cell: (p) => h('code', {title: p.digest}, String(p.digest || '').slice(0, 19))},
      {label: 'Installed', sort: 'installed_at', cls: 'opt', cell: (p) => `${fmtTime(p.installed_at)} by ${p.installed_by || '?'}`},
    ],
    row: (p) => ({dataset: {package: p.package_id}}),
    empty: 'No package matches.',
  }, view);
  const bindings = listKit({
    id: 'bindings',
    prefix: 'b.',
    path: '/v1/plugin-bindings',
    rows: (a) => a.items || a.bindings || a,
    search: 'Search bindings by org, project, export, package',
    filters: [{name: 'org', label: 'Org', placeholder: 'org id'}, {name: 'status', label: 'Status', options: ['active', 'disabled', 'retired']}],
    columns: [
      {label: 'Org', sort: 'org_id', cell: (b) => b.org_id},
      {label: 'Project', cell: (b) => b.project_id || '(org-wide)'},
      {label: 'Export', sort: 'export_id', cell: (b) => b.export_id},
      {label: 'Package', cell: (b) => `${b.package_id}@${b.package_version}`},
      {label: 'Status', sort: 'status', cell: (b) => b.status},
      {label: 'Rollout', cls: 'num', cell: (b) => `${b.rollout ?? 100}%`},
      {label: 'Config', cls: 'opt', cell: (b) => h('code', {}, JSON.stringify(b.config || {}))},
      {label: 'Secrets', cls: 'opt', cell: (b) => Object.keys(b.secrets || {}).join(', ') || '—'},
    ],
    row: (b) => ({dataset: {binding: b.binding_id}}),
    empty: 'No binding matches.',
  }, view);
  render(h('h1', {}, 'Packages and bindings'), marketSec,
    h('section', {'aria-labelledby': 'pk-h'}, h('h2', {id: 'pk-h'}, 'Installed packages'), packages.node),
    h('section', {'aria-labelledby': 'bd-h'}, h('h2', {id: 'bd-h'}, 'Bindings'), bindings.node));
  view.refresh = () => Promise.all([drawMarket(), packages.draw(), bindings.draw()]);
  await view.refresh();
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
    // A single sign-on session ends at its provider too: the answer names
    // the provider's end-session page, which comes back to the login page.
    let next = '/console/login';
    try {
      const out = await api('POST', '/console/logout', {});
      if (out && typeof out.redirect === 'string' && /^https?:\/\//.test(out.redirect)) next = out.redirect;
    } finally { location.assign(next); }
  });
  await loadAll().catch((e) => toast(errorText(e), 'error'));
  window.addEventListener('hashchange', route);
  route();
  startLive();
}

boot();
