// Images for the playground's next message: picked, pasted or dropped, when the model reads them.
//
// Rules:
// 1. Only while the selected model has vision (/admin/status `models[].vision`,
//    adapters/status.py rule 5): the Image button shows, and a paste into the input or a
//    drop on the playground takes image files; otherwise both are left alone (a pasted text
//    stays text) and pending images are dropped.
// 2. Each image is read as a data: URL and sent as an OpenAI `image_url` part before the
//    message's text; it stays in the conversation, so later turns resend it and hit the
//    prefix cache over it.
// 3. Only PNG, JPEG, WebP, GIF and BMP, what the daemon reads (serving/vision.py rule 2);
//    another file is named in a note. The daemon's own limits answer as its 400s.
// 4. Previews are blob: URLs of the files (the page's CSP allows img-src blob:), never
//    data: URLs; a preview lives as long as the conversation showing it.

const TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp"];

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export function thumbnail(preview, name) {
  const img = document.createElement("img");
  img.className = "thumb";
  img.src = preview;
  img.alt = name || "image";
  return img;
}

export class Attachments {
  constructor({ button, picker, list, note, zone, input }) {
    Object.assign(this, { button, picker, list, note });
    this.pending = []; // { url: data: URL, preview: blob: URL, name }
    this.previews = []; // every blob: URL made (rule 4)
    this.enabled = false;
    button.addEventListener("click", () => picker.click());
    picker.addEventListener("change", () => {
      this.add([...picker.files]);
      picker.value = "";
    });
    input.addEventListener("paste", (e) => {
      const files = [...(e.clipboardData?.files || [])];
      if (!this.enabled || !files.some((f) => f.type.startsWith("image/"))) return;
      e.preventDefault();
      this.add(files);
    });
    zone.addEventListener("dragover", (e) => {
      if (this.enabled && e.dataTransfer?.types.includes("Files")) e.preventDefault();
    });
    zone.addEventListener("drop", (e) => {
      if (!this.enabled || !e.dataTransfer?.files.length) return;
      e.preventDefault();
      this.add([...e.dataTransfer.files]);
    });
  }

  // Rule 1.
  setEnabled(on) {
    this.enabled = on;
    this.button.hidden = !on;
    if (!on && this.pending.length) this.take();
  }

  async add(files) {
    const refused = [];
    for (const file of files) {
      if (!TYPES.includes(file.type)) {
        refused.push(`${file.name || "file"} is not a PNG, JPEG, WebP, GIF or BMP image`);
        continue;
      }
      const preview = URL.createObjectURL(file);
      this.previews.push(preview);
      this.pending.push({ url: await readDataUrl(file), preview, name: file.name });
    }
    this.note.textContent = refused.join("; ");
    this.render();
  }

  render() {
    this.list.replaceChildren(...this.pending.map((p, i) => {
      const item = document.createElement("span");
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "unattach";
      remove.textContent = "×";
      remove.title = `remove ${p.name || "image"}`;
      remove.addEventListener("click", () => {
        this.pending.splice(i, 1);
        this.render();
      });
      item.append(thumbnail(p.preview, p.name), remove);
      return item;
    }));
    this.list.dataset.count = String(this.pending.length);
  }

  // The pending images, handed over for one message (the list empties).
  take() {
    const taken = this.pending;
    this.pending = [];
    this.note.textContent = "";
    this.render();
    return taken;
  }

  // A new chat: every preview made so far is released (rule 4).
  clear() {
    this.take();
    for (const url of this.previews) URL.revokeObjectURL(url);
    this.previews = [];
  }
}
