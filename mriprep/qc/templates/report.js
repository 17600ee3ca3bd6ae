// Sort a table by a column when its header is clicked: numbers by value, text by text;
// a second click reverses. Cells carry data-value for numbers (NaN sorts last).
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("table.sortable th[data-sort]").forEach(function (th) {
    th.addEventListener("click", function () {
      var table = th.closest("table"), body = table.tBodies[0];
      var column = Array.prototype.indexOf.call(th.parentNode.children, th);
      var numeric = th.dataset.sort === "number";
      var ascending = th.dataset.order !== "asc";
      table.querySelectorAll("th[data-sort]").forEach(function (h) { delete h.dataset.order; });
      th.dataset.order = ascending ? "asc" : "desc";
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[column], y = b.cells[column];
        if (numeric) {
          var u = parseFloat(x.dataset.value), v = parseFloat(y.dataset.value);
          if (isNaN(u) && isNaN(v)) return 0;
          if (isNaN(u)) return 1;
          if (isNaN(v)) return -1;
          return ascending ? u - v : v - u;
        }
        return ascending ? x.textContent.localeCompare(y.textContent)
                         : y.textContent.localeCompare(x.textContent);
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
