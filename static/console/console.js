/* Recovery Console: live updates over a WebSocket, and evidence highlighting.
 *
 * A page opts in to live updates with data-live-url="/ws/..." on a wrapper element. Every
 * "audit.event" or "insights.snapshot" message triggers a (debounced) re-fetch of the page itself; the fresh HTML
 * replaces #fleet-rows or #audit-trail and every element marked data-live-refresh (by id).
 * The server stays the only place that renders anything.
 *
 * Vanilla JavaScript, no libraries.
 */
(function () {
  'use strict';

  var DEBOUNCE_MS = 100; // coalesces a burst of events into one refetch
  var MAX_WAIT_MS = 1000; // a steady stream of events still refreshes at least this often
  var PRIMARY_TARGET_IDS = ['fleet-rows', 'audit-trail'];
  var CONTROLS = 'input, textarea, select, button, a[href], summary, [tabindex]';

  var STATUS_TEXT = {
    connecting: 'Connecting…',
    live: 'Live',
    reconnecting: 'Reconnecting…',
    offline: 'Offline'
  };
  var STATUS_TITLE = {
    connecting: 'Opening the live update channel',
    live: 'This page updates by itself when something happens',
    reconnecting: 'Live updates interrupted; trying again',
    offline: 'Live updates stopped; reload the page'
  };

  /* ---------- live status indicator (its space is reserved in the header) ---------- */

  function setStatus(state, text) {
    var el = document.getElementById('live-status');
    if (!el) return;
    if (el.getAttribute('data-state') === state && !text) return;
    el.setAttribute('data-state', state);
    el.title = STATUS_TITLE[state] || '';
    var label = el.querySelector('.live-status__text');
    if (label) label.textContent = text || STATUS_TEXT[state] || '';
  }

  /* ---------- evidence highlighting inside log excerpts ---------- */

  function highlightEvidence(scope) {
    var blocks = scope.querySelectorAll('pre[data-evidence-line]');
    for (var b = 0; b < blocks.length; b++) {
      var pre = blocks[b];
      if (pre.getAttribute('data-highlighted') === 'yes') continue;
      var needle = (pre.getAttribute('data-evidence-line') || '').trim();
      if (!needle) continue;
      var lines = pre.textContent.split('\n');
      var hit = -1;
      var i;
      for (i = 0; i < lines.length && hit < 0; i++) {
        if (lines[i].trim() === needle) hit = i;
      }
      for (i = 0; i < lines.length && hit < 0; i++) {
        if (lines[i].indexOf(needle) !== -1) hit = i;
      }
      if (hit < 0) continue;
      var fragment = document.createDocumentFragment();
      if (hit > 0) fragment.appendChild(document.createTextNode(lines.slice(0, hit).join('\n') + '\n'));
      var mark = document.createElement('mark');
      mark.textContent = lines[hit];
      fragment.appendChild(mark);
      if (hit < lines.length - 1) {
        fragment.appendChild(document.createTextNode('\n' + lines.slice(hit + 1).join('\n')));
      }
      pre.textContent = '';
      pre.appendChild(fragment);
      pre.setAttribute('data-highlighted', 'yes');
      // Bring the line into view inside the excerpt, without scrolling the page.
      pre.scrollTop = Math.max(0, mark.offsetTop - pre.clientHeight / 3);
    }
  }

  /* ---------- replacing regions while keeping what the user is doing ---------- */

  // A stable key for a control: the nearest id, its form's action, name, type and label,
  // numbered when several controls share one.
  function keyedControls(container) {
    var seen = {};
    var list = [];
    var found = container.querySelectorAll(CONTROLS);
    for (var i = 0; i < found.length; i++) {
      var el = found[i];
      var key;
      if (el.id) {
        key = '#' + el.id;
      } else {
        var holder = el.parentElement ? el.parentElement.closest('[id]') : null;
        var form = el.form || el.closest('form');
        key = [
          holder ? holder.id : '',
          form ? form.getAttribute('action') || '' : '',
          el.tagName,
          el.getAttribute('name') || '',
          el.getAttribute('type') || '',
          el.getAttribute('href') || '',
          el.tagName === 'BUTTON' || el.tagName === 'SUMMARY' ? el.textContent.trim() : ''
        ].join('|');
      }
      seen[key] = (seen[key] || 0) + 1;
      list.push({ key: key + '~' + seen[key], el: el });
    }
    return list;
  }

  // Disclosure widgets keyed by the nearest id around them, so an opened or closed excerpt
  // stays that way when its region is replaced.
  function keyedDetails(container) {
    var seen = {};
    var list = [];
    var found = container.querySelectorAll('details');
    for (var i = 0; i < found.length; i++) {
      var holder = found[i].parentElement ? found[i].parentElement.closest('[id]') : null;
      var key = found[i].id || (holder ? holder.id : '');
      seen[key] = (seen[key] || 0) + 1;
      list.push({ key: key + '~' + seen[key], el: found[i] });
    }
    return list;
  }

  function isToggle(el) {
    var type = (el.getAttribute('type') || '').toLowerCase();
    return el.tagName === 'INPUT' && (type === 'checkbox' || type === 'radio');
  }

  function isTextField(el) {
    if (el.tagName === 'TEXTAREA') return true;
    if (el.tagName !== 'INPUT') return false;
    var type = (el.getAttribute('type') || 'text').toLowerCase();
    return type === 'text' || type === 'search' || type === 'email' || type === 'number';
  }

  function captureState(container) {
    var state = { values: {}, checked: {}, focus: null, selection: null, open: {} };
    var active = document.activeElement;
    keyedControls(container).forEach(function (item) {
      var el = item.el;
      if (isTextField(el) && el.value !== el.defaultValue) state.values[item.key] = el.value;
      // A ticked card (bulk approval) stays ticked when the queue is redrawn around it.
      if (isToggle(el) && el.checked !== el.defaultChecked) state.checked[item.key] = el.checked;
      if (el === active) {
        state.focus = item.key;
        if (isTextField(el)) {
          try {
            state.selection = [el.selectionStart, el.selectionEnd];
          } catch (err) {
            state.selection = null;
          }
        }
      }
    });
    keyedDetails(container).forEach(function (item) {
      state.open[item.key] = item.el.open;
    });
    return state;
  }

  function restoreState(container, state) {
    keyedControls(container).forEach(function (item) {
      var el = item.el;
      if (Object.prototype.hasOwnProperty.call(state.values, item.key) && isTextField(el)) {
        el.value = state.values[item.key];
      }
      if (Object.prototype.hasOwnProperty.call(state.checked, item.key) && isToggle(el)) {
        el.checked = state.checked[item.key];
      }
      if (state.focus === item.key) {
        el.focus({ preventScroll: true });
        if (state.selection && isTextField(el)) {
          try {
            el.setSelectionRange(state.selection[0], state.selection[1]);
          } catch (err) {
            /* some input types have no selection */
          }
        }
      }
    });
    keyedDetails(container).forEach(function (item) {
      if (Object.prototype.hasOwnProperty.call(state.open, item.key)) item.el.open = state.open[item.key];
    });
  }

  function refreshTargets() {
    var list = [];
    PRIMARY_TARGET_IDS.forEach(function (id) {
      var el = document.getElementById(id);
      if (el) list.push(el);
    });
    var marked = document.querySelectorAll('[data-live-refresh][id]');
    for (var i = 0; i < marked.length; i++) {
      if (list.indexOf(marked[i]) === -1) list.push(marked[i]);
    }
    // A region inside another region is covered when the outer one is replaced.
    return list.filter(function (el) {
      return !list.some(function (other) {
        return other !== el && other.contains(el);
      });
    });
  }

  // What the server last sent for each region, to skip replacing what did not change.
  var lastHtml = {};

  function rememberCurrent() {
    refreshTargets().forEach(function (el) {
      lastHtml[el.id] = el.innerHTML;
    });
  }

  function applyFresh(doc) {
    var changed = [];
    refreshTargets().forEach(function (el) {
      var fresh = doc.getElementById(el.id);
      if (!fresh) return;
      var html = fresh.innerHTML;
      if (lastHtml[el.id] === html) return;
      var state = captureState(el);
      el.innerHTML = html;
      lastHtml[el.id] = html;
      restoreState(el, state);
      highlightEvidence(el);
      changed.push(el.id);
    });
    // Charts and other widgets redraw from the regions' fresh data (charts.js).
    if (changed.length) {
      document.dispatchEvent(new CustomEvent('console:refreshed', { detail: { regions: changed } }));
    }
  }

  /* ---------- start ---------- */

  var root = document.querySelector('[data-live-url]');
  rememberCurrent();
  highlightEvidence(document);
  if (!root) return;
  if (!('WebSocket' in window) || !('fetch' in window) || !('DOMParser' in window) || !window.WRLiveSocket) {
    setStatus('offline', 'No live updates');
    return;
  }

  /* ---------- refreshing the page's live regions ---------- */

  var refreshTimer = null;
  var firstRequestAt = 0;
  var refreshing = false;
  var refreshAgain = false;
  var refreshWhenVisible = false;

  function requestRefresh() {
    if (document.hidden) {
      // Done once, when the tab is shown again.
      refreshWhenVisible = true;
      return;
    }
    var now = Date.now();
    if (!firstRequestAt) firstRequestAt = now;
    var delay = Math.max(0, Math.min(DEBOUNCE_MS, firstRequestAt + MAX_WAIT_MS - now));
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(runRefresh, delay);
  }

  function runRefresh() {
    refreshTimer = null;
    firstRequestAt = 0;
    if (document.hidden) {
      refreshWhenVisible = true;
      return;
    }
    if (refreshing) {
      refreshAgain = true;
      return;
    }
    refreshing = true;
    fetch(location.href, { credentials: 'same-origin', cache: 'no-store', headers: { Accept: 'text/html' } })
      .then(function (response) {
        if (response.redirected) {
          // Sent to the login page: the session is over.
          stopForGood('Signed out');
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html) applyFresh(new DOMParser().parseFromString(html, 'text/html'));
      })
      .catch(function () {
        /* the next event, or the catch-up after reconnecting, tries again */
      })
      .then(function () {
        refreshing = false;
        if (refreshAgain) {
          refreshAgain = false;
          requestRefresh();
        }
      });
  }

  document.addEventListener('visibilitychange', function () {
    if (!document.hidden && refreshWhenVisible) {
      refreshWhenVisible = false;
      requestRefresh();
    }
  });

  /* ---------- the live channel (live_socket.js keeps it open) ---------- */

  var channel = null;

  function stopForGood(text) {
    if (channel) channel.stop();
    setStatus('offline', text);
  }

  channel = window.WRLiveSocket(root.getAttribute('data-live-url'), {
    connecting: function (catchUp) {
      setStatus(catchUp ? 'reconnecting' : 'connecting');
    },
    open: function (catchUp) {
      setStatus('live');
      // Events may have been missed while away.
      if (catchUp) requestRefresh();
    },
    message: function (data) {
      if (data.type === 'audit.event' || data.type === 'insights.snapshot') requestRefresh();
    },
    reconnecting: function () {
      setStatus('reconnecting');
    },
    signedOut: function () {
      setStatus('offline', 'Signed out');
    }
  });
})();
