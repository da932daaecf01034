// A small live line chart on a canvas: one line per series, each on its own scale
// (tok/s and milliseconds do not share an axis), newest sample at the right edge.
// A null value is a gap (nothing measured in that interval), not a zero.

export class Chart {
  // series: [{ color: CSS colour or custom property name, label }]
  constructor(canvas, series, capacity = 120) {
    this.canvas = canvas;
    this.series = series;
    this.capacity = capacity;
    this.samples = []; // arrays aligned with `series`
    this.count = 0;
  }

  push(values) {
    this.samples.push(values);
    if (this.samples.length > this.capacity) this.samples.shift();
    this.count += 1;
    this.canvas.dataset.samples = String(this.count);
    this.draw();
  }

  resize() {
    const ratio = window.devicePixelRatio || 1;
    const { width, height } = this.canvas.getBoundingClientRect();
    const w = Math.max(1, Math.round(width * ratio)), h = Math.max(1, Math.round(height * ratio));
    if (this.canvas.width !== w || this.canvas.height !== h) {
      this.canvas.width = w;
      this.canvas.height = h;
    }
    return ratio;
  }

  draw() {
    const ratio = this.resize();
    const ctx = this.canvas.getContext("2d");
    const { width, height } = this.canvas;
    const style = getComputedStyle(document.documentElement);
    ctx.clearRect(0, 0, width, height);
    ctx.lineWidth = 2 * ratio;
    ctx.font = `${11 * ratio}px system-ui, sans-serif`;
    const step = width / Math.max(1, this.capacity - 1);
    const x0 = width - (this.samples.length - 1) * step;
    const peaks = [];
    this.series.forEach((s, k) => {
      const values = this.samples.map((v) => v[k]);
      const measured = values.some((v) => v != null);
      const max = Math.max(1e-9, ...values.filter((v) => v != null));
      peaks.push(measured ? max.toFixed(1) : "");
      const y = (v) => height - 4 * ratio - (v / max) * (height - 20 * ratio);
      ctx.strokeStyle = ctx.fillStyle = style.getPropertyValue(s.color).trim() || s.color;
      ctx.beginPath();
      let drawing = false;
      values.forEach((v, i) => {
        if (v == null) {
          drawing = false;
          return;
        }
        if (drawing) ctx.lineTo(x0 + i * step, y(v));
        else ctx.moveTo(x0 + i * step, y(v));
        drawing = true;
      });
      ctx.stroke();
      const peak = measured ? `${s.label} max ${max.toFixed(max < 10 ? 1 : 0)}` : "";
      ctx.fillText(peak, 4 * ratio + k * 150 * ratio, 12 * ratio);
    });
    this.canvas.dataset.peaks = peaks.join(","); // what is drawn, readable without pixels
  }
}
