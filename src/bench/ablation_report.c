/* Writers of the ablation report (ablation_report.h): Markdown table, SVG bar chart, JSON
 * lines. Everything printed comes from the struct, so the output is reproducible from numbers. */
#include "bench/ablation_report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool cell_ok(const ds_abl_row *row, int j) {
    return row->run && isfinite(row->cells[j].tpot_ms) && row->cells[j].tpot_ms > 0;
}

bool ds_abl_change(const ds_abl_report *r, int i, int j, double *d_ms, double *d_pct) {
    if (i <= 0 || i >= r->n_rows || j < 0 || j >= r->n_batches || !cell_ok(&r->rows[i], j))
        return false;
    int p = i - 1;
    while (p >= 0 && !r->rows[p].run) p--; /* compare with what was measured before */
    if (p < 0 || !cell_ok(&r->rows[p], j)) return false;
    const double prev = r->rows[p].cells[j].tpot_ms, cur = r->rows[i].cells[j].tpot_ms;
    *d_ms = cur - prev;
    *d_pct = 100.0 * (cur - prev) / prev;
    return true;
}

int ds_abl_b1_column(const ds_abl_report *r) {
    for (int j = 0; j < r->n_batches; j++)
        if (r->batches[j] == 1) return j;
    return 0;
}

int ds_abl_best_row(const ds_abl_report *r, int j) {
    int best = -1;
    for (int i = 0; i < r->n_rows; i++)
        if (cell_ok(&r->rows[i], j) &&
            (best < 0 || r->rows[i].cells[j].tpot_ms < r->rows[best].cells[j].tpot_ms))
            best = i;
    return best;
}

static const char *str_or(const char *s, const char *dflt) { return s && *s ? s : dflt; }

/* Text for a Markdown table cell: '|' would split the cell. */
static void md_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n') fputc(' ', f);
        else fputc(*s, f);
    }
}

int ds_abl_write_markdown(const ds_abl_report *r, FILE *f) {
    const int jb1 = ds_abl_b1_column(r);
    bool any_computed = false;
    fprintf(f, "# Optimisation ablation\n\n");
    fprintf(f, "- commit: `%s`\n", str_or(r->commit, "unknown"));
    fprintf(f, "- GPU / device: %s (backend %s)\n", str_or(r->gpu, "unknown"),
            str_or(r->backend, "unknown"));
    fprintf(f, "- model: `%s`\n", str_or(r->model, "unknown"));
    fprintf(f, "- command: `%s`\n", str_or(r->command, "deltaserve bench --ablation"));
    fprintf(f, "- date: %s\n", str_or(r->date_utc, "unknown"));
    fprintf(f, "- decode: %d measured steps after %d warm-up steps per batch size, context %d "
               "tokens + the steps; TPOT = median step time (greedy, tokens fed back); TTFT = "
               "median prefill of a %d-token prompt\n",
            r->steps, r->warmup, r->prompt_len, r->prompt_len);
    fprintf(f, "- each row = the previous row + one item; change = this row − the previous row "
               "that ran (positive = slower)\n\n");

    fprintf(f, "| # | item (catalogue no.) | TPOT c=%d", r->n_batches ? r->batches[0] : 1);
    for (int j = 1; j < r->n_batches; j++) fprintf(f, " | c=%d", r->batches[j]);
    fprintf(f, " | TTFT %d | change vs previous row (", r->prompt_len);
    for (int j = 0; j < r->n_batches; j++) fprintf(f, "%sc=%d", j ? " / " : "", r->batches[j]);
    fprintf(f, ", in ms and %%) |\n|---|---|");
    for (int j = 0; j < r->n_batches; j++) fprintf(f, "---|");
    fprintf(f, "---|---|\n");

    for (int i = 0; i < r->n_rows; i++) {
        const ds_abl_row *row = &r->rows[i];
        fprintf(f, "| %d | ", row->index);
        md_text(f, row->label);
        if (row->items && *row->items) fprintf(f, " (%s)", row->items);
        if (!row->run) {
            fprintf(f, " | ");
            md_text(f, str_or(row->note, "not run"));
            for (int j = 1; j < r->n_batches; j++) fprintf(f, " | —");
            fprintf(f, " | — | — |\n");
            continue;
        }
        for (int j = 0; j < r->n_batches; j++) {
            const ds_abl_cell *c = &row->cells[j];
            if (cell_ok(row, j)) fprintf(f, " | %.3f ms%s", c->tpot_ms, c->computed ? " †" : "");
            else fprintf(f, " | —");
            any_computed |= c->computed;
        }
        if (isfinite(row->ttft_ms) && row->ttft_ms > 0) fprintf(f, " | %.1f ms", row->ttft_ms);
        else fprintf(f, " | —");
        bool has_prev = false; /* an earlier row ran: this one has something to compare with */
        for (int p = 0; p < i; p++) has_prev |= r->rows[p].run;
        fprintf(f, " | ");
        if (!has_prev) fprintf(f, "reference");
        for (int j = 0; j < r->n_batches && has_prev; j++) {
            double d, pct;
            if (j) fprintf(f, " / ");
            if (ds_abl_change(r, i, j, &d, &pct)) fprintf(f, "%+.3f ms (%+.1f%%)", d, pct);
            else fprintf(f, "—");
        }
        fprintf(f, " |\n");
    }
    fprintf(f, "\n");

    for (int i = 0; i < r->n_rows; i++) {
        const ds_abl_row *row = &r->rows[i];
        if (!row->spec) continue;
        if (!row->run) {
            fprintf(f, "Row %d (MTP speculative decoding): %s.\n\n", row->index,
                    str_or(row->note, "not run"));
            continue;
        }
        fprintf(f, "Row %d (MTP speculative decoding, k = %d): c=%d is the measured time per "
                   "emitted token of a greedy batch-1 speculative generation of %d tokens "
                   "(plain decode in the same engine: %.3f ms); acceptance rate %.2f, %.2f "
                   "tokens per verification step.",
                row->index, row->spec_k, r->batches[jb1], row->spec_generated, row->plain_ms_b1,
                row->acceptance_rate, row->tokens_per_step);
        if (row->acceptance_rate <= 0)
            fprintf(f, " Nothing was accepted: with random (dummy) weights the MTP head's drafts "
                       "never match the target, so this row shows the cost of speculation, not "
                       "its benefit.");
        fprintf(f, "\n\n");
        if (any_computed) {
            fprintf(f, "† computed from measured step times, not a generation: (verify + draft) "
                       "/ %.2f tokens per step (the measured acceptance):", row->tokens_per_step);
            for (int j = 0; j < r->n_batches; j++)
                if (row->cells[j].computed)
                    fprintf(f, " c=%d: (%.3f + %.3f) / %.2f;", r->batches[j],
                            row->cells[j].verify_ms, row->cells[j].draft_ms,
                            row->tokens_per_step);
            fprintf(f, "\n\n");
        }
    }

    const int best = ds_abl_best_row(r, jb1);
    if (best >= 0) {
        const ds_abl_row *row = &r->rows[best];
        fprintf(f, "Best c=%d row: %d (", r->n_batches ? r->batches[jb1] : 1, row->index);
        md_text(f, row->label);
        fprintf(f, ") at %.3f ms", row->cells[jb1].tpot_ms);
        if (r->n_rows > 0 && best > 0 && cell_ok(&r->rows[0], jb1)) {
            const double base = r->rows[0].cells[jb1].tpot_ms;
            fprintf(f, ", %+.1f%% vs row %d", 100.0 * (row->cells[jb1].tpot_ms - base) / base,
                    r->rows[0].index);
        }
        fprintf(f, ".\n");
    } else {
        fprintf(f, "Best c=1 row: none (no row ran).\n");
    }
    return ferror(f) ? -1 : 0;
}

/* ---- SVG ------------------------------------------------------------------------------------ */

static void xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20) fputc(*s, f); /* no control characters in XML 1.0 */
        }
    }
}

/* A round tick step (1, 2 or 5 × 10^n) giving about 5 ticks up to vmax. */
static double tick_step(double vmax) {
    const double raw = vmax / 5.0;
    const double p = pow(10.0, floor(log10(raw)));
    const double m = raw / p;
    return (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * p;
}

int ds_abl_write_svg(const ds_abl_report *r, FILE *f) {
    static const char *colours[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                    "#edc948", "#b07aa1", "#ff9da7"};
    const int nc = (int)(sizeof colours / sizeof colours[0]);
    const int nb = r->n_batches > 0 ? r->n_batches : 1;
    const double bar_w = 18, group_gap = 28, left = 70, right = 170, top = 60, plot_h = 300;
    const double group_w = nb * bar_w + group_gap;
    const double plot_w = (r->n_rows > 0 ? r->n_rows : 1) * group_w;
    const double width = fmax(left + plot_w + right, 640.0);
    const double height = top + plot_h + 64 + 14.0 * r->n_rows;
    double vmax = 0;
    for (int i = 0; i < r->n_rows; i++)
        for (int j = 0; j < r->n_batches; j++)
            if (cell_ok(&r->rows[i], j) && r->rows[i].cells[j].tpot_ms > vmax)
                vmax = r->rows[i].cells[j].tpot_ms;
    if (!(vmax > 0)) vmax = 1;
    const double step = tick_step(vmax);
    const double ymax = ceil(vmax / step - 1e-9) * step;
    const double y0 = top + plot_h; /* the x axis */

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
            width, height, width, height);
    fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", left);
    fputs("deltaserve optimisation ablation: decode TPOT per row — commit ", f);
    xml_text(f, str_or(r->commit, "unknown"));
    fputs(", ", f);
    xml_text(f, str_or(r->gpu, "unknown"));
    fputs("</text>\n", f);
    fprintf(f, "<text x=\"%.0f\" y=\"42\" font-size=\"11\">", left);
    xml_text(f, str_or(r->model, ""));
    fprintf(f, ", %d-token context, median of %d steps; each row adds one item to the previous "
               "row</text>\n", r->prompt_len, r->steps);

    /* y axis: ticks, grid and labels */
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left,
            top, left, y0);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left,
            y0, left + plot_w, y0);
    for (int t = 0; t * step <= ymax + step * 1e-6; t++) {
        const double v = t * step, y = y0 - v / ymax * plot_h;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                left, y, left + plot_w, y);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                left - 5, y, left, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", left - 8, y + 4,
                v);
    }
    fprintf(f, "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" "
               "text-anchor=\"middle\">TPOT (ms per token)</text>\n",
            top + plot_h / 2, top + plot_h / 2);

    /* bars: one group per row, one bar per batch size */
    bool any_computed = false;
    for (int i = 0; i < r->n_rows; i++) {
        const ds_abl_row *row = &r->rows[i];
        const double gx = left + i * group_w + group_gap / 2;
        for (int j = 0; j < r->n_batches; j++) {
            if (!cell_ok(row, j)) continue;
            const ds_abl_cell *c = &row->cells[j];
            const double h = c->tpot_ms / ymax * plot_h;
            fprintf(f, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                       "fill=\"%s\"%s><title>row %d, c=%d: %.3f ms%s</title></rect>\n",
                    gx + j * bar_w, y0 - h, bar_w - 2, h, colours[j % nc],
                    c->computed ? " fill-opacity=\"0.45\"" : "", row->index, r->batches[j],
                    c->tpot_ms, c->computed ? " (computed)" : "");
            any_computed |= c->computed;
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">#%d</text>\n",
                gx + nb * bar_w / 2, y0 + 16, row->index);
        if (!row->run)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">not "
                       "run</text>\n", gx + nb * bar_w / 2, y0 - 6);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">ablation row</text>\n",
            left + plot_w / 2, y0 + 34);
    /* row labels under the chart, one line each, so the numbers on the x axis mean something */
    for (int i = 0; i < r->n_rows; i++) {
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"10\">#%d ", left, y0 + 52 + i * 14.0,
                r->rows[i].index);
        xml_text(f, r->rows[i].label);
        if (r->rows[i].items && *r->rows[i].items) {
            fputs(" (", f);
            xml_text(f, r->rows[i].items);
            fputs(")", f);
        }
        fputs("</text>\n", f);
    }

    /* legend */
    const double lx = left + plot_w + 20;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">concurrency</text>\n", lx, top);
    for (int j = 0; j < r->n_batches; j++) {
        const double ly = top + 12 + j * 20;
        fprintf(f, "<rect class=\"legend\" x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" "
                   "fill=\"%s\"/>\n", lx, ly, colours[j % nc]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">c=%d</text>\n", lx + 18, ly + 10, r->batches[j]);
    }
    if (any_computed)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">pale: computed from step "
                   "times</text>\n", lx, top + 22 + r->n_batches * 20);
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}

/* ---- JSON lines ------------------------------------------------------------------------------ */

static double round4(double x) { return round(x * 1e4) / 1e4; }

static void add_num_or_null(cJSON *o, const char *k, double v, bool have) {
    if (have && isfinite(v)) cJSON_AddNumberToObject(o, k, round4(v));
    else cJSON_AddNullToObject(o, k);
}

static int emit_line(cJSON *o, FILE *f) {
    char *s = cJSON_PrintUnformatted(o);
    int rc = -1;
    if (s) {
        rc = fprintf(f, "%s\n", s) < 0 ? -1 : 0;
        cJSON_free(s);
    }
    cJSON_Delete(o);
    return rc;
}

int ds_abl_write_jsonl(const ds_abl_report *r, FILE *f) {
    for (int i = 0; i < r->n_rows; i++) {
        const ds_abl_row *row = &r->rows[i];
        for (int j = 0; j < (row->run ? r->n_batches : 1); j++) {
            const ds_abl_cell *c = &row->cells[j];
            cJSON *o = cJSON_CreateObject();
            if (!o) return -1;
            cJSON_AddStringToObject(o, "commit", str_or(r->commit, "unknown"));
            cJSON_AddStringToObject(o, "gpu", str_or(r->gpu, "unknown"));
            cJSON_AddStringToObject(o, "backend", str_or(r->backend, "unknown"));
            cJSON_AddStringToObject(o, "model", str_or(r->model, ""));
            cJSON_AddNumberToObject(o, "row", row->index);
            cJSON_AddStringToObject(o, "label", str_or(row->label, ""));
            cJSON_AddStringToObject(o, "items", str_or(row->items, ""));
            cJSON_AddStringToObject(o, "switches", str_or(row->switches, ""));
            cJSON_AddBoolToObject(o, "run", row->run);
            if (!row->run) {
                cJSON_AddStringToObject(o, "note", str_or(row->note, "not run"));
                if (emit_line(o, f)) return -1;
                continue;
            }
            cJSON_AddNumberToObject(o, "batch", r->batches[j]);
            cJSON_AddNumberToObject(o, "prompt_len", r->prompt_len);
            cJSON_AddNumberToObject(o, "steps", r->steps);
            add_num_or_null(o, "step_ms", c->tpot_ms, true);
            add_num_or_null(o, "step_ms_p10", c->p10_ms, c->p10_ms > 0);
            add_num_or_null(o, "step_ms_p90", c->p90_ms, c->p90_ms > 0);
            add_num_or_null(o, "ttft_ms", row->ttft_ms, true);
            if (c->kernels) cJSON_AddNumberToObject(o, "kernels_per_step", (double)c->kernels);
            else cJSON_AddNullToObject(o, "kernels_per_step");
            cJSON_AddBoolToObject(o, "graph", c->graph);
            cJSON_AddBoolToObject(o, "computed", c->computed);
            if (row->spec) {
                cJSON_AddNumberToObject(o, "num_speculative_tokens", row->spec_k);
                add_num_or_null(o, "verify_ms", c->verify_ms, c->verify_ms > 0);
                add_num_or_null(o, "draft_ms", c->draft_ms, c->draft_ms > 0);
                add_num_or_null(o, "acceptance_rate", row->acceptance_rate, true);
                add_num_or_null(o, "mean_accepted_length", row->tokens_per_step, true);
                cJSON_AddNumberToObject(o, "generated", row->spec_generated);
                add_num_or_null(o, "plain_ms_per_token", row->plain_ms_b1, row->plain_ms_b1 > 0);
            }
            cJSON_AddStringToObject(o, "date", str_or(r->date_utc, ""));
            if (emit_line(o, f)) return -1;
        }
    }
    return ferror(f) ? -1 : 0;
}
