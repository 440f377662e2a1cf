// Buttons with data-confirm ask before they submit. The question is read from the
// attribute as text, never evaluated: no inline handlers anywhere (the CSP forbids them).
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
    event.stopImmediatePropagation();
  }
}, true);
