/* Recovery Console: one live channel, kept open.
 *
 * WRLiveSocket(url, handlers) opens a WebSocket to url and keeps it: reconnects with a backoff
 * (1 s doubling to 30 s), pings every 25 s and drops a socket that does not answer, reconnects
 * at once when the network is back or the page is restored from the back/forward cache, closes
 * on pagehide, and stops for good when the server closes with 4401 (signed out or role taken).
 * Used by console.js (a page's live regions) and nav_badge.js (the count of approvals).
 *
 * handlers (all optional):
 *   connecting(catchUp)  a connection is being opened; catchUp: after a break
 *   open(catchUp)        it is open; catchUp: events may have been missed while away
 *   message(data)        a JSON message other than the answer to a ping
 *   reconnecting()       it broke and will be opened again
 *   signedOut()          the server refused the user: nothing more is tried
 * Returns { stop: function () } to stop for good (e.g. when a fetch finds the session over).
 * Vanilla JavaScript, no libraries.
 */
(function () {
  'use strict';

  var PING_MS = 25000;
  var BACKOFF_MIN_MS = 1000;
  var BACKOFF_MAX_MS = 30000;
  var UNAUTHORISED_CLOSE_CODE = 4401; // console/consumers.py

  window.WRLiveSocket = function (path, handlers) {
    var url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + path;
    var socket = null;
    var backoff = BACKOFF_MIN_MS;
    var reconnectTimer = null;
    var pingTimer = null;
    var awaitingReply = false;
    var needCatchUp = false;
    var stopped = false;

    function call(name, argument) {
      if (typeof handlers[name] === 'function') handlers[name](argument);
    }

    function connect() {
      reconnectTimer = null;
      if (stopped || socket) return;
      call('connecting', needCatchUp);
      var ws;
      try {
        ws = new WebSocket(url);
      } catch (err) {
        scheduleReconnect();
        return;
      }
      socket = ws;

      ws.onopen = function () {
        if (socket !== ws) return;
        backoff = BACKOFF_MIN_MS;
        startPing(ws);
        var catchUp = needCatchUp;
        needCatchUp = false;
        call('open', catchUp);
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
        if (data && data.type !== 'pong') call('message', data);
      };

      ws.onclose = function (event) {
        if (socket !== ws) return;
        socket = null;
        stopPing();
        if (event.code === UNAUTHORISED_CLOSE_CODE) {
          stop();
          call('signedOut');
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
      needCatchUp = true;
      call('reconnecting');
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
      clearTimeout(reconnectTimer);
      reconnectTimer = null;
      dropSocket();
    }

    window.addEventListener('online', function () {
      // The network is back: do not sit out the rest of a long backoff.
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
      // Restored from the back/forward cache: the socket is gone and the page is old.
      if (event.persisted && !stopped) {
        needCatchUp = true;
        backoff = BACKOFF_MIN_MS;
        connect();
      }
    });

    connect();
    return { stop: stop };
  };
})();
