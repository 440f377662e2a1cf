// Canary form: under each arm's policy select, show that policy's parameters (with their
// help text); the server renders every policy's block and hides all but the chosen one.
(() => {
  document.querySelectorAll("select[data-policy-arm]").forEach((select) => {
    const box = document.getElementById(`${select.dataset.policyArm}-params`);
    if (!box) return;
    const sync = () => {
      box.querySelectorAll("[data-policy]").forEach((block) => {
        block.hidden = block.dataset.policy !== select.value;
      });
    };
    select.addEventListener("change", sync);
    sync();
  });
})();
