//! The SVG bar chart: one row per contender, hot and spread bars side by side, checks/s on a
//! log scale (the contenders span three orders of magnitude and more).

use std::{error::Error, path::Path};

use plotters::{
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

const HOT: RGBColor = RGBColor(214, 69, 65);
const SPREAD: RGBColor = RGBColor(52, 101, 164);
const STRIPE: RGBColor = RGBColor(243, 244, 246);
const FONT: &str = "sans-serif";

/// Axis ticks: `10k`, `100k`, `1M`, `10M`.
fn tick(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// Bar values: `123`, `45.6k`, `157k`, `5.58M`.
fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// `bars`: (contender, [hot, spread] median checks/s), drawn top to bottom in this order.
pub fn write_svg(
    path: &Path,
    title: &str,
    bars: &[(String, [f64; 2])],
) -> Result<(), Box<dyn Error>> {
    let n = bars.len();
    let row = 34u32;
    let longest = bars
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(10);
    let label_width = (longest as f64 * 6.8) as u32 + 20;
    let (width, height) = (label_width + 900, 150 + row * n as u32);
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    root.draw(&Text::new(
        title,
        (12, 14),
        (FONT, 22)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Top)),
    ))?;

    let values = || {
        bars.iter()
            .flat_map(|(_, v)| v.iter().copied())
            .filter(|v| *v > 0.0)
    };
    let max = values().fold(1.0, f64::max);
    let min = values().fold(f64::INFINITY, f64::min).min(max);
    let lo = 10f64.powf(min.log10().floor());
    let hi = 10f64.powf(max.log10().ceil()).max(lo * 10.0);

    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_top(80) // room for the title and the legend
        .margin_right(70) // room for the value of the longest bar
        .x_label_area_size(44)
        .y_label_area_size(label_width)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..n as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("checks per second (log scale)")
        .x_label_formatter(&|v| tick(*v))
        .x_label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(WHITE)
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;

    // Row `i` (from the top) spans y in [n - i - 1, n - i]: hot above, spread below.
    let bottom = |i: usize| (n - i - 1) as f64;
    chart.draw_series(
        (0..n)
            .filter(|i| i % 2 == 1)
            .map(|i| Rectangle::new([(lo, bottom(i)), (hi, bottom(i) + 1.0)], STRIPE.filled())),
    )?;
    for (k, (color, y0, y1)) in [(HOT, 0.52, 0.88), (SPREAD, 0.12, 0.48)]
        .into_iter()
        .enumerate()
    {
        let bars_k = bars.iter().enumerate().filter(|(_, (_, v))| v[k] > 0.0);
        chart.draw_series(bars_k.clone().map(|(i, (_, v))| {
            Rectangle::new(
                [(lo, bottom(i) + y0), (v[k], bottom(i) + y1)],
                color.filled(),
            )
        }))?;
        chart.draw_series(bars_k.map(|(i, (_, v))| {
            EmptyElement::at((v[k], bottom(i) + (y0 + y1) / 2.0))
                + Text::new(
                    human(v[k]),
                    (4, 0),
                    (FONT, 12)
                        .into_font()
                        .color(&BLACK.mix(0.75))
                        .pos(Pos::new(HPos::Left, VPos::Center)),
                )
        }))?;
    }

    // Contender names, right-aligned against the axis, centred on their row.
    let label = (FONT, 14)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Right, VPos::Center));
    for (i, (name, _)) in bars.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(lo, bottom(i) + 0.5));
        root.draw(&Text::new(name.as_str(), (x - 8, y), label.clone()))?;
    }

    // Legend, under the title, left-aligned with the plot.
    let (left, top) = chart.backend_coord(&(lo, n as f64));
    for (j, (name, color)) in [
        ("hot: one key, far over its limit", HOT),
        ("spread: keys drawn from 100,000 ids", SPREAD),
    ]
    .into_iter()
    .enumerate()
    {
        let x = left + j as i32 * 300;
        let y = top - 22;
        root.draw(&Rectangle::new(
            [(x, y - 6), (x + 16, y + 6)],
            color.filled(),
        ))?;
        root.draw(&Text::new(
            name,
            (x + 22, y),
            (FONT, 14)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }
    root.present()?;
    Ok(())
}
