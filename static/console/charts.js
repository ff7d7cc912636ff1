/* Recovery Console: plotly charts built on the server, drawn here.
 *
 * A chart is <div class="chart" data-chart-source="ID">, where ID names a
 * <script type="application/json"> element holding a plotly figure ({data, layout}). The figure's
 * element may sit inside a live region (console.js replaces those); the chart's own element
 * should not, so a refresh redraws it in place with Plotly.react instead of rebuilding it (no
 * flicker, no layout shift: the element's height is set by CSS before plotly runs).
 *
 * Colours follow the page's theme (CSS variables), and charts are redrawn when the theme changes.
 */
(function () {
  'use strict';

  var drawn = {}; // chart source id -> JSON text last drawn

  function cssVar(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name);
    return value && value.trim() ? value.trim() : fallback;
  }

  // Theme colours are light-dark() pairs, which only an element's computed colour resolves.
  var probe = null;
  function cssColour(name, fallback) {
    if (!probe) {
      probe = document.createElement('span');
      probe.style.display = 'none';
      document.body.appendChild(probe);
    }
    probe.style.color = '';
    probe.style.color = 'var(' + name + ', ' + fallback + ')';
    return getComputedStyle(probe).color || fallback;
  }

  function themed(layout) {
    var fg = cssColour('--text', '#1c2330');
    var muted = cssColour('--text-muted', '#5a6474');
    var grid = cssColour('--border', '#d9dde3');
    var out = Object.assign({}, layout);
    out.paper_bgcolor = 'rgba(0,0,0,0)';
    out.plot_bgcolor = 'rgba(0,0,0,0)';
    out.font = Object.assign({ family: cssVar('--font-sans', 'system-ui, sans-serif'), size: 12 }, out.font || {}, {
      color: fg
    });
    Object.keys(out).forEach(function (key) {
      if (/^[xy]axis\d*$/.test(key)) {
        out[key] = Object.assign({}, out[key], {
          gridcolor: grid,
          linecolor: grid,
          zerolinecolor: grid,
          tickfont: Object.assign({}, (out[key] || {}).tickfont, { color: muted })
        });
      }
    });
    if (out.legend) out.legend = Object.assign({}, out.legend, { bgcolor: 'rgba(0,0,0,0)' });
    out.autosize = true;
    return out;
  }

  function draw(chart, force) {
    if (!window.Plotly) return;
    var sourceId = chart.getAttribute('data-chart-source');
    var source = sourceId ? document.getElementById(sourceId) : null;
    if (!source) return;
    var text = source.textContent;
    if (!force && drawn[sourceId] === text) return;
    var figure;
    try {
      figure = JSON.parse(text);
    } catch (err) {
      chart.setAttribute('data-chart-error', 'unreadable figure');
      return;
    }
    drawn[sourceId] = text;
    var config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ['select2d', 'lasso2d'] };
    window.Plotly.react(chart, figure.data || [], themed(figure.layout || {}), config);
    chart.setAttribute('data-chart-drawn', 'yes');
  }

  function drawAll(force) {
    var charts = document.querySelectorAll('.chart[data-chart-source]');
    for (var i = 0; i < charts.length; i++) draw(charts[i], force);
  }

  document.addEventListener('console:refreshed', function () {
    drawAll(false);
  });
  document.addEventListener('console:themechange', function () {
    drawAll(true);
  });
  if (window.matchMedia) {
    var media = window.matchMedia('(prefers-color-scheme: dark)');
    var onChange = function () {
      drawAll(true);
    };
    if (media.addEventListener) media.addEventListener('change', onChange);
  }
  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', function () {
      drawAll(true);
    });
  } else {
    drawAll(true);
  }
})();
