//! SVG plots drawn with `plotters`: bytes over time (`memory.svg`) from the history, and a
//! segment occupancy map (`segments.svg`) from a pool state. The SVG text is returned; text is
//! rendered by the viewer (no fonts are loaded).

use plotters::prelude::*;

use super::summary::format_bytes;
use super::ReportError;
use crate::history::{History, Totals};
use crate::state::{PoolState, SegmentState, SpanKind};

const USED: RGBColor = RGBColor(70, 130, 180);
const PENDING: RGBColor = RGBColor(255, 165, 0);
const FREE: RGBColor = RGBColor(225, 225, 225);
const REQUESTED: RGBColor = RGBColor(44, 160, 44);
const ALLOCATED: RGBColor = RGBColor(31, 119, 180);
const RESERVED: RGBColor = RGBColor(214, 39, 40);

fn plot_error(what: &'static str) -> impl Fn(String) -> ReportError {
    move |reason| ReportError::Plot { what, reason }
}

/// A unit to divide by, and its name.
fn byte_unit(max_bytes: u64) -> (f64, &'static str) {
    match max_bytes {
        0..=0x3fff => (1.0, "B"),
        0x4000..=0xff_ffff => (1024.0, "KiB"),
        0x100_0000..=0x3_ffff_ffff => (1024.0 * 1024.0, "MiB"),
        _ => (1024.0 * 1024.0 * 1024.0, "GiB"),
    }
}

fn time_unit(max_us: u64) -> (f64, &'static str) {
    match max_us {
        0..=9_999 => (1.0, "µs"),
        10_000..=9_999_999 => (1_000.0, "ms"),
        _ => (1_000_000.0, "s"),
    }
}

/// `memory.svg`: requested, allocated and reserved bytes over time, as steps, from the history's
/// baseline to `end_time_us` (microseconds since the pool was created).
///
/// # Errors
///
/// [`ReportError::Plot`] if plotters fails.
pub fn memory_svg(history: &History, end_time_us: u64) -> Result<String, ReportError> {
    let timeline = history.timeline();
    let start_us = history.events().front().map_or(0, |event| event.time_us);
    let end_us = end_time_us
        .max(timeline.last().map_or(0, |(time_us, _)| *time_us))
        .max(start_us.saturating_add(1));
    let peaks = history.peaks();
    let max_bytes = peaks.reserved_bytes.max(peaks.allocated_bytes).max(1);
    let (byte_div, byte_name) = byte_unit(max_bytes);
    let (time_div, time_name) = time_unit(end_us);
    // Allocated is drawn wide under requested: the two coincide where nothing is rounded.
    let series: [(&str, RGBColor, u32, Pick); 3] = [
        ("reserved", RESERVED, 2, |t| t.reserved_bytes),
        ("allocated", ALLOCATED, 6, |t| t.allocated_bytes),
        ("requested", REQUESTED, 2, |t| t.requested_bytes),
    ];
    let scaled_steps = |pick: Pick| {
        let baseline = pick(&history.baseline());
        let points = steps(baseline, &timeline, pick, start_us, end_us);
        let scale = |(us, bytes): (u64, u64)| (us as f64 / time_div, bytes as f64 / byte_div);
        points.into_iter().map(scale).collect::<Vec<_>>()
    };

    let mut svg = String::new();
    {
        let error = plot_error("memory.svg");
        let root = SVGBackend::with_string(&mut svg, (1000, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| error(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(memory_caption(history, &peaks), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                start_us as f64 / time_div..end_us as f64 / time_div,
                0.0..max_bytes as f64 / byte_div * 1.05,
            )
            .map_err(|e| error(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc(format!("time since the pool was created ({time_name})"))
            .y_desc(byte_name)
            .draw()
            .map_err(|e| error(e.to_string()))?;
        for (name, color, width, pick) in series {
            let style = if width > 2 {
                color.mix(0.45).stroke_width(width)
            } else {
                color.stroke_width(width)
            };
            chart
                .draw_series(LineSeries::new(scaled_steps(pick), style))
                .map_err(|e| error(e.to_string()))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| error(e.to_string()))?;
        root.present().map_err(|e| error(e.to_string()))?;
    }
    Ok(svg)
}

/// Picks one series of `memory.svg` out of the totals.
type Pick = fn(&Totals) -> u64;

/// One series of `memory.svg` as the corners of its steps, `(time_us, bytes)`: from `baseline`
/// at `start_us`, through each change on `timeline`, to `end_us`.
fn steps(
    baseline: u64,
    timeline: &[(u64, Totals)],
    pick: Pick,
    start_us: u64,
    end_us: u64,
) -> Vec<(u64, u64)> {
    let mut previous = baseline;
    let mut points = vec![(start_us, previous)];
    for (time_us, totals) in timeline {
        let value = pick(totals);
        if value != previous {
            points.push((*time_us, previous));
            points.push((*time_us, value));
            previous = value;
        }
    }
    points.push((end_us, previous));
    points
}

/// The caption of `memory.svg`: the peaks, and whether anything was recorded.
fn memory_caption(history: &History, peaks: &Totals) -> String {
    format!(
        "wgpu-pool memory over time (peak reserved {}, peak allocated {}{})",
        format_bytes(peaks.reserved_bytes),
        format_bytes(peaks.allocated_bytes),
        if history.is_empty() {
            "; no events recorded"
        } else {
            ""
        }
    )
}

/// Rows drawn in `segments.svg` before the rest are counted instead.
pub const SVG_MAX_SEGMENTS: usize = 200;

/// The width of `segments.svg`, in pixels.
const MAP_WIDTH: u32 = 1000;
/// The height of one segment's row in `segments.svg`, in pixels.
const MAP_ROW: i32 = 26;
/// The space above the first row of `segments.svg` (title and legend), in pixels.
const MAP_TOP: i32 = 64;
/// Where the bars of `segments.svg` start (the labels are left of them), in pixels.
const MAP_LEFT: i32 = 200;
/// The margin right of the longest bar of `segments.svg`, in pixels.
const MAP_RIGHT: i32 = 20;

/// The drawing area of an SVG plot, and what drawing on it returns.
type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// `segments.svg`: one row per segment, its length proportional to its size, with its
/// allocations (blue), pending frees (orange) and free blocks (grey).
///
/// # Errors
///
/// [`ReportError::Plot`] if plotters fails.
pub fn segments_svg(state: &PoolState) -> Result<String, ReportError> {
    let shown = state.segments.len().min(SVG_MAX_SEGMENTS);
    let height = MAP_TOP + MAP_ROW * (shown as i32 + 1) + 10;
    let largest = state
        .segments
        .iter()
        .map(|segment| segment.size_bytes)
        .max()
        .unwrap_or(1)
        .max(1);
    let bar_width = f64::from(MAP_WIDTH as i32 - MAP_LEFT - MAP_RIGHT);
    let x = |bytes: u64| {
        MAP_LEFT.saturating_add((bytes as f64 / largest as f64 * bar_width).round() as i32)
    };

    let mut svg = String::new();
    {
        let error = plot_error("segments.svg");
        let draw = |e: DrawingAreaErrorKind<std::io::Error>| error(e.to_string());
        let root =
            SVGBackend::with_string(&mut svg, (MAP_WIDTH, height as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(draw)?;
        draw_map_heading(&root, state).map_err(draw)?;
        for (row, segment) in state.segments.iter().take(shown).enumerate() {
            draw_map_row(&root, MAP_TOP + row as i32 * MAP_ROW, segment, &x).map_err(draw)?;
        }
        if shown < state.segments.len() {
            root.draw(&Text::new(
                format!("... and {} more segments", state.segments.len() - shown),
                (10, MAP_TOP + shown as i32 * MAP_ROW + 3),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(draw)?;
        }
        root.present().map_err(draw)?;
    }
    Ok(svg)
}

/// The title of `segments.svg` (the pool's totals) and the legend of its colours.
fn draw_map_heading(root: &Area<'_>, state: &PoolState) -> Drawn {
    let stats = &state.stats;
    root.draw(&Text::new(
        format!(
            "wgpu-pool segments: {} segments, {} reserved, {} allocated, {} requested",
            state.segments.len(),
            format_bytes(stats.reserved_bytes.current),
            format_bytes(stats.allocated_bytes.current),
            format_bytes(stats.requested_bytes.current)
        ),
        (10, 10),
        ("sans-serif", 18).into_font(),
    ))?;
    for (i, (name, color)) in [("used", USED), ("pending free", PENDING), ("free", FREE)]
        .into_iter()
        .enumerate()
    {
        let x0 = MAP_LEFT + i as i32 * 140;
        root.draw(&Rectangle::new([(x0, 38), (x0 + 14, 52)], color.filled()))?;
        root.draw(&Text::new(
            name,
            (x0 + 20, 38),
            ("sans-serif", 13).into_font(),
        ))?;
    }
    Ok(())
}

/// One segment's row of `segments.svg`, from `y0` down: its label, its spans (runs of one kind
/// as one rectangle each), the boundaries between neighbouring allocations where there is room
/// to see them, and its outline. `x` is the abscissa of an offset, in pixels.
fn draw_map_row(
    root: &Area<'_>,
    y0: i32,
    segment: &SegmentState,
    x: &impl Fn(u64) -> i32,
) -> Drawn {
    let y1 = y0 + MAP_ROW - 6;
    root.draw(&Text::new(
        format!(
            "seg {} {} {}",
            segment.id.0,
            format_bytes(segment.size_bytes),
            segment.kind()
        ),
        (10, y0 + 3),
        ("sans-serif", 13).into_font(),
    ))?;
    let mut run_start = 0;
    for (index, span) in segment.spans.iter().enumerate() {
        let run_ends = segment
            .spans
            .get(index + 1)
            .is_none_or(|next| next.kind != span.kind);
        if run_ends {
            let color = match span.kind {
                SpanKind::Allocated => USED,
                SpanKind::PendingFree => PENDING,
                SpanKind::Free => FREE,
            };
            let (x0, x1) = (
                x(run_start),
                x(span.end_bytes()).max(x(run_start).saturating_add(1)),
            );
            root.draw(&Rectangle::new([(x0, y0), (x1, y1)], color.filled()))?;
            run_start = span.end_bytes();
        }
    }
    let mut last_line: Option<i32> = None;
    for pair in segment.spans.windows(2) {
        if pair[0].kind != SpanKind::Free && pair[1].kind != SpanKind::Free {
            let line_x = x(pair[1].offset_bytes);
            if last_line.is_none_or(|last| line_x - last >= 3) {
                root.draw(&PathElement::new(
                    vec![(line_x, y0), (line_x, y1)],
                    WHITE.stroke_width(1),
                ))?;
                last_line = Some(line_x);
            }
        }
    }
    root.draw(&Rectangle::new(
        [(x(0), y0), (x(segment.size_bytes), y1)],
        BLACK.stroke_width(1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::HistoryOptions;
    use crate::state::fixtures::synthetic;

    #[test]
    fn memory_plot_has_three_series() {
        let (state, history) = synthetic();
        let svg = memory_svg(&history, state.time_us).expect("svg");
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        for name in ["reserved", "allocated", "requested"] {
            assert!(svg.contains(name), "{name} missing");
        }
        assert!(svg.matches("<polyline").count() >= 3);
    }

    #[test]
    fn memory_plot_of_an_empty_history_says_so() {
        let history = History::new(HistoryOptions::default(), Totals::default());
        let svg = memory_svg(&history, 0).expect("svg");
        assert!(svg.contains("no events recorded"));
    }

    #[test]
    fn segment_plot_draws_each_segment() {
        let (state, _) = synthetic();
        let svg = segments_svg(&state).expect("svg");
        assert!(svg.contains("seg 0 4.00 MiB packed"), "{svg}");
        assert!(svg.contains("<rect"));
    }

    #[test]
    fn plots_of_sizes_and_times_at_the_end_of_u64_are_drawn() {
        let mut history = History::new(HistoryOptions::default(), Default::default());
        for segment in 0..2 {
            history.record(crate::history::Event::new(
                crate::history::EventKind::SegmentAlloc,
                u64::MAX,
                u64::MAX,
                u64::MAX,
                Some(crate::policy::SegmentId(segment)),
                0,
            ));
        }
        assert!(memory_svg(&history, u64::MAX).is_ok());
        assert!(crate::report::chrome_trace(&history, u64::MAX).is_object());
    }

    #[test]
    fn maps_of_spans_that_sum_past_u64_are_drawn() {
        use crate::state::{SegmentState, Span};
        let (mut state, _) = synthetic();
        state.segments = vec![SegmentState {
            id: crate::policy::SegmentId(0),
            size_bytes: u64::MAX,
            class: crate::policy::SegmentClass::Packed,
            spans: vec![
                Span::allocated(0, u64::MAX, u64::MAX),
                Span::allocated(u64::MAX, u64::MAX, 5),
            ],
        }];
        assert_eq!(state.segments[0].allocated_bytes(), u64::MAX);
        assert!(segments_svg(&state).is_ok());
        assert!(!crate::report::segment_map(&state, 80).is_empty());
    }
}
