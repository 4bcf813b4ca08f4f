// A Prometheus histogram for the per-request series (HTTP answers, actor requests), registered in
// a prom-client Registry and exposed as prom-client's own Histogram exposes it. prom-client's
// observe builds and hashes a labels object on every call (about 2 µs, a twentieth of a
// cached read's whole cost); here a series is looked up once by a key its caller builds, and an
// observation is a bucket search and three additions.
import type { Metric, Registry } from "prom-client";

interface Series {
  labels: Record<string, string>;
  /** Observations per bucket (not cumulative); the last counts those above every bound. */
  counts: number[];
  sum: number;
  count: number;
}

/** One value of the exposition, as prom-client's registry formats them. */
interface ExposedValue {
  metricName: string;
  labels: Record<string, string | number>;
  sharedLabels: Record<string, string>;
  value: number;
}

export class LabeledHistogram<L extends string> {
  readonly type = "histogram";
  readonly aggregator = "sum";
  private series = new Map<string, Series>();

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly bounds: readonly number[],
    registry: Registry,
  ) {
    registry.registerMetric(this as unknown as Metric);
  }

  /**
   * Records `value` in the series `key` (any string that names one label set); `labels` is asked
   * for only the first time the key is seen.
   */
  observe(key: string, labels: () => Record<L, string>, value: number): void {
    let series = this.series.get(key);
    if (series === undefined) {
      series = { labels: labels(), counts: new Array(this.bounds.length + 1).fill(0), sum: 0, count: 0 };
      this.series.set(key, series);
    }
    let bucket = 0;
    while (bucket < this.bounds.length && value > this.bounds[bucket]!) bucket++;
    series.counts[bucket]!++;
    series.sum += value;
    series.count++;
  }

  /** What prom-client's Registry formats: cumulative buckets, `+Inf`, sum and count per series. */
  async getForPromString() {
    const values: ExposedValue[] = [];
    const bucketName = `${this.name}_bucket`;
    for (const { labels, counts, sum, count } of this.series.values()) {
      let cumulative = 0;
      this.bounds.forEach((le, i) => {
        cumulative += counts[i]!;
        values.push({ metricName: bucketName, labels: { le }, sharedLabels: labels, value: cumulative });
      });
      values.push({ metricName: bucketName, labels: { le: "+Inf" }, sharedLabels: labels, value: count });
      values.push({ metricName: `${this.name}_sum`, labels: {}, sharedLabels: labels, value: sum });
      values.push({ metricName: `${this.name}_count`, labels: {}, sharedLabels: labels, value: count });
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }

  /** The same values with each series' labels in `labels` (`Registry.getMetricsAsJSON`). */
  async get() {
    const exposed = await this.getForPromString();
    const values = exposed.values.map(({ sharedLabels, labels, ...rest }) => ({
      ...rest,
      labels: { ...labels, ...sharedLabels },
    }));
    return { ...exposed, values };
  }

  reset(): void {
    this.series.clear();
  }
}
