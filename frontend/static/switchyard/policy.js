// Policy page: the "new policy" fields are enabled only when "new" is chosen.
(() => {
  const choice = document.getElementById("policy-choice");
  const fields = document.getElementById("new-policy");
  if (!choice || !fields) return;
  const sync = () => {
    fields.disabled = choice.value !== "new";
    fields.classList.toggle("hidden", choice.value !== "new");
  };
  choice.addEventListener("change", sync);
  sync();
})();
