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

  var holder = document.getElementById('nav-approvals-count');
  if (!holder) return; // signed out, or a role that may not see the approval queue
  if (document.querySelector('[data-live-url="' + FLEET_CHANNEL + '"]')) return; // console.js
  if (!('WebSocket' in window) || !('fetch' in window) || !window.WRLiveSocket) return;

  var countUrl = holder.getAttribute('data-count-url');
  var kinds = (holder.getAttribute('data-count-kinds') || '').split(/\s+/).filter(Boolean);

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

  /* ---------- the fleet channel (live_socket.js keeps it open) ---------- */

  function stop() {
    stopped = true;
    holder.setAttribute('data-live-state', 'stopped');
    clearTimeout(timer);
    if (channel) channel.stop();
  }

  var channel = window.WRLiveSocket(FLEET_CHANNEL, {
    open: function () {
      holder.setAttribute('data-live-state', 'live');
      // Listening from now on: one read covers what changed since the page was rendered, or
      // while the channel was down.
      requestCount();
    },
    message: function (data) {
      if (data.type === 'audit.event' && kinds.indexOf(data.kind) !== -1) requestCount();
    },
    reconnecting: function () {
      holder.setAttribute('data-live-state', 'reconnecting');
    },
    signedOut: stop
  });
})();
