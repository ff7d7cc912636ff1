/* Recovery Console: the navigation's count of recommendations awaiting approval, kept live.
 *
 * The count (#nav-approvals-count, templates/base.html) is rendered with every page. A page whose
 * live region listens to the whole fleet (data-live-url="/ws/live/") re-renders it with its other
 * regions (console.js: the count is marked data-live-refresh), so nothing more is needed there.
 * On every other page (no live channel, or a workload's own) this script opens the fleet channel
 * itself and, on an audit event that may change the count (data-count-kinds), fetches the count
 * (data-count-url, a few bytes of JSON), debounced. Each time the channel opens it fetches once,
 * for what changed since the page was rendered or while the channel was down, and once when a
 * hidden tab is shown again after such an event. data-live-state says whether it listens.
 *
 * It never touches the page's live status indicator: that tells about the page's own channel.
 * Vanilla JavaScript, no libraries.
 */
(function () {
  'use strict';

  var FLEET_CHANNEL = '/ws/live/';
  var DEBOUNCE_MS = 250; // a burst of decisions is one fetch
  var PING_MS = 25000;
  var BACKOFF_MIN_MS = 1000;
  var BACKOFF_MAX_MS = 30000;
  var UNAUTHORISED_CLOSE_CODE = 4401; // console/consumers.py

  var holder = document.getElementById('nav-approvals-count');
  if (!holder) return; // signed out, or a role that may not see the approval queue
  if (document.querySelector('[data-live-url="' + FLEET_CHANNEL + '"]')) return; // console.js
  if (!('WebSocket' in window) || !('fetch' in window)) return;

  var countUrl = holder.getAttribute('data-count-url');
  var kinds = (holder.getAttribute('data-count-kinds') || '').split(/\s+/).filter(Boolean);
  var socketUrl = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + FLEET_CHANNEL;

  /* ---------- the count ---------- */

  function show(answer) {
    // The same markup as templates/base.html renders.
    holder.textContent = '';
    if (!answer.count) return;
    var label = String(answer.label || '');
    var badge = document.createElement('span');
    badge.className = 'nav-count__badge';
    badge.setAttribute('aria-hidden', 'true');
    badge.title = label.charAt(0).toUpperCase() + label.slice(1);
    badge.textContent = String(answer.text);
    var words = document.createElement('span');
    words.className = 'visually-hidden';
    words.textContent = ' (' + label + ')';
    holder.appendChild(badge);
    holder.appendChild(words);
  }

  var timer = null;
  var fetching = false;
  var again = false;
  var whenVisible = false;
  var stopped = false;

  function requestCount() {
    if (stopped) return;
    if (document.hidden) {
      whenVisible = true; // fetched once, when the tab is shown again
      return;
    }
    clearTimeout(timer);
    timer = setTimeout(fetchCount, DEBOUNCE_MS);
  }

  function fetchCount() {
    timer = null;
    if (fetching) {
      again = true;
      return;
    }
    fetching = true;
    fetch(countUrl, { credentials: 'same-origin', cache: 'no-store', headers: { Accept: 'application/json' } })
      .then(function (response) {
        if (response.redirected) {
          stop(); // sent to the login page: the session is over
          return null;
        }
        return response.ok ? response.json() : null;
      })
      .then(function (answer) {
        if (answer && typeof answer.count === 'number') show(answer);
      })
      .catch(function () {
        /* the next event, or the catch-up after reconnecting, tries again */
      })
      .then(function () {
        fetching = false;
        if (again) {
          again = false;
          requestCount();
        }
      });
  }

  document.addEventListener('visibilitychange', function () {
    if (!document.hidden && whenVisible) {
      whenVisible = false;
      requestCount();
    }
  });

  /* ---------- the fleet channel ---------- */

  var socket = null;
  var backoff = BACKOFF_MIN_MS;
  var reconnectTimer = null;
  var pingTimer = null;
  var awaitingReply = false;

  function connect() {
    reconnectTimer = null;
    if (stopped || socket) return;
    var ws;
    try {
      ws = new WebSocket(socketUrl);
    } catch (err) {
      scheduleReconnect();
      return;
    }
    socket = ws;

    ws.onopen = function () {
      if (socket !== ws) return;
      backoff = BACKOFF_MIN_MS;
      holder.setAttribute('data-live-state', 'live');
      startPing(ws);
      // Listening from now on: one read covers what changed since the page was rendered, or
      // while the channel was down.
      requestCount();
    };

    ws.onmessage = function (event) {
      if (socket !== ws) return;
      awaitingReply = false;
      var data;
      try {
        data = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      if (data && data.type === 'audit.event' && kinds.indexOf(data.kind) !== -1) requestCount();
    };

    ws.onclose = function (event) {
      if (socket !== ws) return;
      socket = null;
      stopPing();
      holder.setAttribute('data-live-state', 'reconnecting');
      if (event.code === UNAUTHORISED_CLOSE_CODE) {
        stop();
        return;
      }
      scheduleReconnect();
    };

    ws.onerror = function () {
      /* a close event follows and schedules the reconnect */
    };
  }

  function scheduleReconnect() {
    if (stopped || reconnectTimer) return;
    var delay = backoff;
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    reconnectTimer = setTimeout(connect, delay);
  }

  function startPing(ws) {
    stopPing();
    awaitingReply = false;
    pingTimer = setInterval(function () {
      if (socket !== ws || ws.readyState !== WebSocket.OPEN) return;
      if (awaitingReply) {
        // No answer to the last ping: the connection is dead without having said so.
        dropSocket();
        scheduleReconnect();
        return;
      }
      awaitingReply = true;
      try {
        ws.send(JSON.stringify({ type: 'ping' }));
      } catch (err) {
        dropSocket();
        scheduleReconnect();
      }
    }, PING_MS);
  }

  function stopPing() {
    if (pingTimer) clearInterval(pingTimer);
    pingTimer = null;
  }

  function dropSocket() {
    var ws = socket;
    socket = null;
    stopPing();
    if (ws) {
      try {
        ws.close(1000);
      } catch (err) {
        /* already closed */
      }
    }
  }

  function stop() {
    stopped = true;
    holder.setAttribute('data-live-state', 'stopped');
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    clearTimeout(timer);
    dropSocket();
  }

  window.addEventListener('online', function () {
    if (reconnectTimer && !stopped) {
      clearTimeout(reconnectTimer);
      reconnectTimer = null;
      connect();
    }
  });

  window.addEventListener('pagehide', function () {
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    dropSocket();
  });

  window.addEventListener('pageshow', function (event) {
    // Restored from the back/forward cache: the socket is gone and the count may be old.
    if (event.persisted && !stopped) {
      backoff = BACKOFF_MIN_MS;
      connect();
    }
  });

  connect();
})();
