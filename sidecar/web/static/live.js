// What changes while a page is open, without a reload. Optional: without
// JavaScript the pages are the same, and a reload shows what is new.
//
// Times: each <time data-since> (how long a call has waited) and <time
// data-until> (the time left before a quarantine ends) is counted on from
// the console's own clock at render (data-now), so the browser's clock
// does not matter.
//
// The queue: every two seconds its content is fetched again and replaced
// when it changed.
(function () {
  "use strict";

  function age(ms) {
    var s = Math.max(0, Math.floor(ms / 1000));
    var m = Math.floor(s / 60), h = Math.floor(s / 3600), d = Math.floor(s / 86400);
    if (s < 60) return s + "s";
    if (s < 3600) return m + "m";
    if (s < 86400) return h + "h" + (m % 60 ? (m % 60) + "m" : "");
    return d + "d" + (h % 24 ? (h % 24) + "h" : "");
  }

  function clocks() {
    var now = Date.now();
    var times = document.querySelectorAll("time[data-now]");
    for (var i = 0; i < times.length; i++) {
      var t = times[i];
      if (!t.hasAttribute("data-seen")) t.setAttribute("data-seen", String(now));
      var elapsed = now - Number(t.getAttribute("data-seen"));
      var at = Number(t.getAttribute("data-now")) + elapsed;
      if (t.hasAttribute("data-since")) {
        t.textContent = age(at - Number(t.getAttribute("data-since")));
      } else if (t.hasAttribute("data-until")) {
        var left = Number(t.getAttribute("data-until")) - at;
        t.textContent = left > 0 ? "in " + age(left) : "now";
      }
    }
  }
  clocks();
  window.setInterval(clocks, 1000);

  var queue = document.getElementById("queue");
  var status = document.getElementById("live");
  if (!queue || !window.fetch) return;
  // The digest of the queue as shown; the server sends the digest of each
  // fresh copy, so an unchanged queue is neither replaced nor announced.
  var last = queue.getAttribute("data-digest");
  function tick() {
    fetch("/queue.fragment", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.assign("/signin"); return null; }
        if (!r.ok) return null;
        var digest = r.headers.get("X-Queue-Digest");
        return r.text().then(function (text) { return [digest, text]; });
      })
      .then(function (answer) {
        if (answer === null || answer[0] === last) return;
        queue.innerHTML = answer[1];
        queue.setAttribute("data-digest", answer[0]);
        last = answer[0];
        clocks();
        status.textContent = "Updated at " + new Date().toLocaleTimeString() + ".";
      })
      .catch(function () {
        status.textContent = "Not updating: the console is not reachable.";
      })
      .then(function () { window.setTimeout(tick, 2000); });
  }
  window.setTimeout(tick, 2000);
})();
