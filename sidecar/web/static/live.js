// The queue without a reload: every two seconds the queue's content is
// fetched again and replaced when it changed. Optional: without JavaScript
// the page is the same, and a reload shows what is new.
(function () {
  "use strict";
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
        status.textContent = "Updated at " + new Date().toLocaleTimeString() + ".";
      })
      .catch(function () {
        status.textContent = "Not updating: the console is not reachable.";
      })
      .then(function () { window.setTimeout(tick, 2000); });
  }
  window.setTimeout(tick, 2000);
})();
