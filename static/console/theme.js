/* Recovery Console: light, dark, or as the operating system says.
 *
 * Loaded without defer in <head>, so the chosen theme applies before the first paint (no flash).
 * The header button cycles auto → light → dark; the choice stays in localStorage.
 */
(function () {
  'use strict';

  var KEY = 'wr-theme';
  var ORDER = ['auto', 'light', 'dark'];
  var LABEL = { auto: 'Auto', light: 'Light', dark: 'Dark' };

  function stored() {
    try {
      var value = window.localStorage.getItem(KEY);
      return value === 'light' || value === 'dark' ? value : 'auto';
    } catch (err) {
      return 'auto';
    }
  }

  function apply(theme) {
    var root = document.documentElement;
    if (theme === 'auto') root.removeAttribute('data-theme');
    else root.setAttribute('data-theme', theme);
    var button = document.getElementById('theme-toggle');
    if (button) {
      button.textContent = LABEL[theme];
      button.setAttribute('data-theme-choice', theme);
      button.setAttribute('aria-label', 'Theme: ' + theme + '. Switch theme');
      button.title = 'Theme: ' + theme + ' (click to switch: auto, light, dark)';
    }
  }

  apply(stored());

  document.addEventListener('DOMContentLoaded', function () {
    var button = document.getElementById('theme-toggle');
    if (!button) return;
    apply(stored());
    button.setAttribute('data-ready', 'yes');
    button.addEventListener('click', function () {
      var next = ORDER[(ORDER.indexOf(stored()) + 1) % ORDER.length];
      try {
        if (next === 'auto') window.localStorage.removeItem(KEY);
        else window.localStorage.setItem(KEY, next);
      } catch (err) {
        /* private mode: the choice lasts for this page only */
      }
      apply(next);
      document.dispatchEvent(new CustomEvent('console:themechange', { detail: { theme: next } }));
    });
  });
})();
