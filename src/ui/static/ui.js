// Live numbers on pages that carry data-live fields; every page reads the same without this.
(function () {
  "use strict";
  var fields = document.querySelectorAll("[data-live]");
  if (!fields.length || !window.EventSource) { return; }
  var source = new EventSource("/ui/events");
  source.addEventListener("counts", function (event) {
    var counts;
    try { counts = JSON.parse(event.data); } catch (e) { return; }
    fields.forEach(function (el) {
      var value = counts[el.getAttribute("data-live")];
      if (value !== undefined) { el.textContent = String(value); }
    });
  });
})();
