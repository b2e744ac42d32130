"""What a sweep file asks for, one kind of study per module behind one interface (study.py):
grid and random search (grid), Optuna (optuna_search), the bracket search of the lr per batch size
(bracket, its Tune searcher bracket_search), branch studies (branch_study) and ladders (ladder, its
rungs ladder_plan); which kind a file asks for, and registering more (kinds). Beside them what
every kind lays its trials out with (search_space), grouped early stopping (grouped_asha) and the
dry run's corners (corners)."""
