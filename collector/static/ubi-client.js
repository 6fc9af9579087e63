/*! ubi-client.js: a User Behavior Insights (UBI 1.3.0) browser client for ubi-pipeline. Apache-2.0.
 *
 * No dependencies. Records one query record per search (with its ordered hit ids), an impression when a
 * result becomes visible (once per search and result), and clicks with their position. Records are batched
 * (size and time limits), retried with exponential backoff and jitter, sent with navigator.sendBeacon when
 * the page is hidden, and kept in localStorage (capped) until the collector has acknowledged them.
 *
 * Positions are 0-based (event_attributes.position.ordinal = 0 for the first result), as OpenSearch tooling
 * counts; the collector's processors read them with Settings.position_base = 0.
 *
 * Every record carries its own id (query_id, event_id), so a record sent twice (a retry, a beacon and a
 * later fetch of the same queue) is stored once: the collector deduplicates on them.
 *
 * Records follow the UBI 1.3.0 JSON Schemas: a field that is not known is left out, never sent as null, and
 * event_attributes, whose schema requires a position, carries the one given or else the object's place in
 * the hits of its search, and is left out when there is nothing to put in it. The one exception: an object
 * (or attributes) with no known position, say add_to_cart on a product page, is sent without a position,
 * because dropping the caller's data would be worse; pass position (a 0-based ordinal or {x, y} on the
 * page) to stay within the schema.
 */
(function (root) {
  "use strict";

  var DEFAULTS = {
    endpoint: "",           // collector base URL; "" means the page's own origin
    application: "search",  // UBI application: the search box these records come from
    apiKey: null,           // X-API-Key of the application, when the collector requires keys
    objectIdField: "_id",   // name of the id field the hit ids use (sku, asin, _id)
    userId: null,           // optional user id (the collector can pseudonymise it)
    batchSize: 50,          // send when this many records wait...
    flushInterval: 5000,    // ...or this many ms after the first one was queued
    maxQueue: 1000,         // records kept while the collector is unreachable; the oldest go first
    retryBase: 1000,        // first retry after up to 1 s, then 2, 4, ... (full jitter) ...
    retryMax: 60000,        // ... never more than a minute apart
    impressionThreshold: 0.5, // share of a result that must be on screen to count as an impression
    storagePrefix: "ubi_"
  };
  var PATHS = { queries: "/v1/queries", events: "/v1/events" };
  var BEACON_BYTES = 60000;  // browsers cap in-flight beacon data at 64 KiB
  var MAX_SEARCHES = 50;     // searches remembered for events that name an earlier query_id

  function uuid() {
    var c = root.crypto;
    if (c && c.randomUUID) return c.randomUUID();  // secure contexts only
    var b = new Uint8Array(16), i, h = "";
    if (c && c.getRandomValues) c.getRandomValues(b);
    else for (i = 0; i < 16; i++) b[i] = Math.floor(Math.random() * 256);
    b[6] = (b[6] & 0x0f) | 0x40;  // version 4
    b[8] = (b[8] & 0x3f) | 0x80;  // RFC 4122 variant
    for (i = 0; i < 16; i++) h += (b[i] + 0x100).toString(16).slice(1) + (i === 3 || i === 5 || i === 7 || i === 9 ? "-" : "");
    return h;
  }

  // Storage may be missing or throw (privacy modes, quota): then the client keeps everything in memory.
  function warn(text) {
    if (root.console && root.console.warn) root.console.warn("ubi-client: " + text);
  }

  function store(kind) {
    try { var s = root[kind]; s.setItem("ubi_probe", "1"); s.removeItem("ubi_probe"); return s; } catch (e) { return null; }
  }
  function keep(storage, key, make) {
    var v = null;
    try { v = storage && storage.getItem(key); } catch (e) { /* unavailable */ }
    if (!v) { v = make(); try { if (storage) storage.setItem(key, v); } catch (e) { /* unavailable */ } }
    return v;
  }

  function Client(options) {
    var o = {}, k;
    for (k in DEFAULTS) o[k] = DEFAULTS[k];
    for (k in options || {}) o[k] = options[k];
    o.endpoint = String(o.endpoint || "").replace(/\/+$/, "");
    this.o = o;
    this.local = store("localStorage");
    this.clientId = keep(this.local, o.storagePrefix + "client_id", uuid);                 // persisted
    this.sessionId = keep(store("sessionStorage"), o.storagePrefix + "session_id", uuid);  // per tab session
    this.key = o.storagePrefix + "queue:" + uuid();  // this page's queue in localStorage
    this.queue = [];    // entries {k: "queries"|"events", r: record, b: 1 once handed to a beacon}
    this.seen = {};     // impressions already recorded: query_id + "\u001f" + object_id
    this.last = null;   // the latest search: {query_id, user_query, hits}
    this.searches = {}; // recent searches by query_id (at most MAX_SEARCHES), for events that name one
    this.failures = 0;
    this.timer = null;
    this.timerAt = 0;
    this.retryAt = 0;   // no fetch before this time (backoff, Retry-After)
    this.inflight = null;
    this.limit = o.batchSize;
    this.stats = { sent: 0, duplicates: 0, rejected: 0, dropped: 0, retries: 0, beacons: 0 };
    this.adopt();
    var self = this;
    if (root.document && root.addEventListener) {
      root.document.addEventListener("visibilitychange", function () {
        if (root.document.visibilityState === "hidden") self.beacon();
        else self.unbeacon();
      });
      root.addEventListener("pagehide", function () { self.beacon(); });
      root.addEventListener("online", function () { self.retryAt = 0; self.schedule(0); });
    }
  }

  Client.prototype.now = function () { return new Date().toISOString(); };

  /** Record a search: returns its query_id. hitIds are the result ids in the order shown. */
  Client.prototype.search = function (userQuery, hitIds, attributes) {
    var q = {
      query_id: uuid(), client_id: this.clientId, application: this.o.application, timestamp: this.now(),
      user_query: String(userQuery), query_attributes: attributes || {}, object_id_field: this.o.objectIdField,
      query_response_hit_ids: (hitIds || []).map(String)
    };
    this.last = { query_id: q.query_id, user_query: q.user_query, hits: q.query_response_hit_ids };
    this.remember(this.last);
    this.add("queries", q);
    return q.query_id;
  };

  Client.prototype.remember = function (search) {
    var ids = Object.keys(this.searches);
    if (ids.length >= MAX_SEARCHES) delete this.searches[ids[0]];  // insertion order: the oldest goes
    this.searches[search.query_id] = search;
  };

  // A position as UBI 1.3.0 has it: {ordinal: n} (0-based) or {xy: {x, y}}; null when there is none.
  function position(given, objectId, search) {
    if (typeof given === "number" || typeof given === "string") {
      var n = Number(given);
      if (given !== "" && Number.isInteger(n) && n >= 0) return { ordinal: n };
    } else if (given && typeof given.x === "number" && typeof given.y === "number" && isFinite(given.x) &&
               isFinite(given.y)) {
      return { xy: { x: given.x, y: given.y } };
    }
    var at = objectId != null && search && search.hits ? search.hits.indexOf(String(objectId)) : -1;
    return at >= 0 ? { ordinal: at } : null;
  }

  /** Record any event (click, impression, add_to_cart, ...) about an object at a 0-based position.
   *  details: {objectId, position (0-based ordinal or {x, y}), queryId, userQuery, message, messageType,
   *  attributes}. Fields that are not known are left out (the UBI schemas have no nulls). */
  Client.prototype.event = function (actionName, details) {
    var d = details || {};
    var search = d.queryId ? this.searches[d.queryId] : this.last;
    var e = {
      action_name: String(actionName), event_id: uuid(), session_id: this.sessionId, client_id: this.clientId,
      application: this.o.application, timestamp: this.now()
    };
    var queryId = d.queryId || (search && search.query_id);
    if (queryId) e.query_id = String(queryId);
    var userQuery = d.userQuery != null ? d.userQuery : search && search.user_query;
    if (userQuery != null) e.user_query = String(userQuery);
    if (this.o.userId != null) e.user_id = String(this.o.userId);
    if (d.messageType) e.message_type = String(d.messageType);
    if (d.message) e.message = String(d.message);
    var attrs = {}, any = false, a;
    for (a in d.attributes || {}) { attrs[a] = d.attributes[a]; any = true; }
    if (d.objectId != null) {
      attrs.object = { object_id: String(d.objectId), object_id_field: this.o.objectIdField };
      any = true;
    }
    var pos = position(d.position, d.objectId, search);
    if (pos) { attrs.position = pos; any = true; }
    // Nothing to say: no event_attributes at all (UBI 1.3.0 requires a position in it). An object or
    // attributes without a known position still go (see the header): the caller's data outweighs the schema.
    if (any) e.event_attributes = attrs;
    this.add("events", e);
    return e.event_id;
  };

  Client.prototype.click = function (objectId, position, queryId) {
    return this.event("click", { objectId: objectId, position: position, queryId: queryId });
  };

  Client.prototype.impression = function (objectId, position, queryId) {
    var key = (queryId || (this.last || {}).query_id) + "\u001f" + objectId;
    if (this.seen[key]) return null;  // each result is an impression once per search
    this.seen[key] = 1;
    return this.event("impression", { objectId: objectId, position: position, queryId: queryId });
  };

  /** Watch the results in container (elements with data-ubi-id) for impressions and clicks. */
  Client.prototype.trackResults = function (container, queryId) {
    var self = this, nodes = container.querySelectorAll("[data-ubi-id]"), i;
    container.setAttribute("data-ubi-query-id", queryId);
    if (!container.ubiTracked) {
      container.ubiTracked = true;
      var onClick = function (ev) {
        if (ev.type === "auxclick" && ev.button !== 1) return;  // middle click opens a tab: still a click
        var el = ev.target && ev.target.closest && ev.target.closest("[data-ubi-id]");
        if (el && container.contains(el)) {
          self.click(el.getAttribute("data-ubi-id"), Number(el.getAttribute("data-ubi-position")),
                     container.getAttribute("data-ubi-query-id"));
        }
      };
      container.addEventListener("click", onClick, true);  // capture: recorded before any navigation
      container.addEventListener("auxclick", onClick, true);
    }
    if (this.observer) this.observer.disconnect();
    for (i = 0; i < nodes.length; i++) {
      if (!nodes[i].hasAttribute("data-ubi-position")) nodes[i].setAttribute("data-ubi-position", String(i));
    }
    if (!root.IntersectionObserver) return;  // old browsers: no impressions rather than wrong ones
    var threshold = this.o.impressionThreshold;
    this.observer = new root.IntersectionObserver(function (entries, observer) {
      entries.forEach(function (en) {
        // Tolerance: the ratio reported at the crossing can round a hair below the threshold.
        if (!en.isIntersecting || en.intersectionRatio < threshold - 0.01) return;
        var el = en.target;
        self.impression(el.getAttribute("data-ubi-id"), Number(el.getAttribute("data-ubi-position")), queryId);
        observer.unobserve(el);
      });
    }, { threshold: [threshold] });
    for (i = 0; i < nodes.length; i++) this.observer.observe(nodes[i]);
  };

  // ------------------------------------------------------------------ the queue

  Client.prototype.add = function (kind, record) {
    this.queue.push({ k: kind, r: record, b: 0 });
    this.cap();
    this.persist();
    this.schedule(this.queue.length >= this.limit ? 0 : this.o.flushInterval);
  };

  Client.prototype.cap = function () {
    var over = this.queue.length - this.o.maxQueue, i;
    // Drop what a beacon has (probably) delivered before anything never sent.
    for (i = 0; over > 0 && i < this.queue.length; ) {
      if (this.queue[i].b) { this.queue.splice(i, 1); over--; this.stats.dropped++; } else i++;
    }
    if (over > 0) { this.queue.splice(0, over); this.stats.dropped += over; }
  };

  Client.prototype.persist = function () {
    if (!this.local) return;
    try {
      if (this.queue.length) this.local.setItem(this.key, JSON.stringify(this.queue));
      else this.local.removeItem(this.key);
    } catch (e) { /* quota: the in-memory queue still holds them */ }
  };

  // Take over queues earlier pages left behind (closed tabs, offline, beacons not confirmed). If another
  // open tab's queue is taken too, both send it; the collector stores each record once.
  Client.prototype.adopt = function () {
    if (!this.local) return;
    var prefix = this.o.storagePrefix + "queue:", keys = [], i, j, items;
    for (i = 0; i < this.local.length; i++) {
      var name = this.local.key(i);
      if (name && name.indexOf(prefix) === 0 && name !== this.key) keys.push(name);
    }
    for (i = 0; i < keys.length; i++) {
      try { items = JSON.parse(this.local.getItem(keys[i]) || "[]"); } catch (e) { items = []; }
      for (j = 0; j < items.length; j++) if (items[j] && items[j].r) this.queue.push({ k: items[j].k, r: items[j].r, b: 0 });
      this.local.removeItem(keys[i]);
    }
    if (this.queue.length) { this.cap(); this.persist(); this.schedule(0); }
  };

  // Flush after delay ms, but not before a backoff ends; an earlier pending flush stays.
  Client.prototype.schedule = function (delay) {
    var self = this, at = Math.max(Date.now() + delay, this.retryAt);
    if (this.timer !== null) {
      if (this.timerAt <= at) return;
      clearTimeout(this.timer);
    }
    this.timerAt = at;
    this.timer = setTimeout(function () { self.timer = null; self.flush(); }, Math.max(0, at - Date.now()));
  };

  Client.prototype.headers = function () {
    var h = { "content-type": "application/json" };
    if (this.o.apiKey) h["x-api-key"] = this.o.apiKey;
    return h;
  };

  /** Send what waits now; resolves when the collector has answered (or the send failed). */
  Client.prototype.flush = function () {
    var self = this;
    if (this.inflight) return this.inflight;
    var batch = this.queue.filter(function (en) { return !en.b; }).slice(0, this.limit);
    if (!batch.length || !root.fetch) return Promise.resolve();
    if (this.timer !== null) { clearTimeout(this.timer); this.timer = null; }
    var sends = ["queries", "events"].map(function (kind) {
      var part = batch.filter(function (en) { return en.k === kind; });
      if (!part.length) return Promise.resolve(null);
      return root.fetch(self.o.endpoint + PATHS[kind], {
        method: "POST", headers: self.headers(), credentials: "omit",
        body: JSON.stringify(part.map(function (en) { return en.r; }))
      }).then(function (res) { return self.settle(part, res); }, function () { return { retry: 0 }; });
    });
    this.inflight = Promise.all(sends).then(function (outcomes) {
      self.inflight = null;
      self.persist();
      var retry = null;
      outcomes.forEach(function (out) { if (out && out.retry !== undefined) retry = Math.max(retry || 0, out.retry); });
      if (retry !== null) {
        self.failures++;
        self.stats.retries++;
        var backoff = Math.min(self.o.retryMax, self.o.retryBase * Math.pow(2, self.failures - 1));
        self.retryAt = Date.now() + Math.max(retry, Math.random() * backoff);  // full jitter, >= Retry-After
        self.schedule(0);
      } else {
        self.failures = 0;
        self.retryAt = 0;
        if (self.queue.some(function (en) { return !en.b; })) self.schedule(self.queue.length >= self.limit ? 0 : self.o.flushInterval);
      }
    });
    return this.inflight;
  };

  // Decide what a response means for the records it carried: done, retry later, or send in halves.
  Client.prototype.settle = function (part, res) {
    var self = this;
    if (res.status === 413 && part.length > 1) {
      this.limit = Math.max(1, Math.floor(part.length / 2));
      return { retry: 0 };
    }
    // 401: a missing or rotated key is fixed by the operator, so keep the records and keep trying.
    if (res.status === 401 || res.status === 408 || res.status === 429 || res.status >= 500) {
      var after = Number(res.headers.get("retry-after"));
      return { retry: after > 0 ? after * 1000 : 0 };
    }
    // 2xx: stored (rejected items are kept by the collector and listed in the answer). Other 4xx (422: every
    // item rejected): the collector refused and kept the records itself; sending them again cannot help.
    // Either way a rejection is told on the console, where the page's developer looks.
    this.remove(part);
    if (res.ok) {
      return res.json().then(function (body) {
        self.stats.sent += body.accepted || 0;
        self.stats.duplicates += body.duplicates || 0;
        self.stats.rejected += body.rejected || 0;
        if (body.rejected) {
          var first = (body.errors || [])[0];
          warn(body.rejected + " of " + part.length + " records rejected by the collector" + (first ?
            ": item " + first.index + (first.field ? " field " + first.field : "") + ": " + first.message : ""));
        }
        return null;
      }, function () { return null; });
    }
    this.stats.rejected += part.length;
    return res.json().then(function (body) { return body && body.message; }, function () { return null; })
      .then(function (message) {
        warn(part.length + " records refused by the collector (HTTP " + res.status + ")" +
          (message ? ": " + message : ""));
        return null;
      });
  };

  Client.prototype.remove = function (part) {
    this.queue = this.queue.filter(function (en) { return part.indexOf(en) < 0; });
  };

  /** The page is going away: hand everything unsent to navigator.sendBeacon (and keep it until confirmed). */
  Client.prototype.beacon = function () {
    var self = this;
    if (this.timer !== null) { clearTimeout(this.timer); this.timer = null; }
    ["queries", "events"].forEach(function (kind) {
      var part = self.queue.filter(function (en) { return en.k === kind && !en.b; });
      while (part.length) {
        var chunk = [], size = 2;
        while (part.length && (chunk.length === 0 || size + JSON.stringify(part[0].r).length + 1 < BEACON_BYTES)) {
          size += JSON.stringify(part[0].r).length + 1;
          chunk.push(part.shift());
        }
        if (self.sendChunk(kind, chunk)) chunk.forEach(function (en) { en.b = 1; });
      }
    });
    this.persist();
  };

  Client.prototype.sendChunk = function (kind, chunk) {
    var body = JSON.stringify(chunk.map(function (en) { return en.r; }));
    var url = this.o.endpoint + PATHS[kind] + (this.o.apiKey ? "?api_key=" + encodeURIComponent(this.o.apiKey) : "");
    // text/plain is CORS-safelisted, so a cross-origin beacon needs no preflight; the body is a JSON array.
    var nav = root.navigator;
    if (nav && nav.sendBeacon && nav.sendBeacon(url, new Blob([body], { type: "text/plain;charset=UTF-8" }))) {
      this.stats.beacons++;
      return true;
    }
    if (!root.fetch) return false;
    try {  // the beacon queue is full: keepalive fetch survives the page too
      root.fetch(url, { method: "POST", body: body, keepalive: true, credentials: "omit",
                        headers: { "content-type": "text/plain;charset=UTF-8" } });
      return true;
    } catch (e) { return false; }
  };

  // The page is visible again: records a beacon carried are sent once more by fetch, which confirms them
  // (the collector counts the copies as duplicates) instead of leaving them in localStorage.
  Client.prototype.unbeacon = function () {
    var any = false;
    this.queue.forEach(function (en) { if (en.b) { en.b = 0; any = true; } });
    if (any) { this.persist(); this.schedule(this.o.flushInterval); }
  };

  Client.prototype.pending = function () { return this.queue.length; };

  var api = { Client: Client, uuid: uuid, init: function (options) { return new Client(options); } };
  root.UbiClient = api;
  if (typeof module === "object" && module.exports) module.exports = api;
})(typeof window !== "undefined" ? window : this);
