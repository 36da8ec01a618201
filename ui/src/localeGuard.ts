// Imported first by main.tsx: ES modules run in import order, and uPlot reads
// navigator.language as soon as its module loads.
import { guardNavigatorLanguage } from './lib/locale';

guardNavigatorLanguage();
